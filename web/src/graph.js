// The job graph: task vertices (chains of operators) in columns by their distance from the
// sources, left to right as Flink draws them, with the edges and their ship strategies. Each
// vertex shows its parallelism, records/s and back-pressure as measured now.
import { html } from 'htm/preact';
import { count, percent } from './format.js';

const NODE_W = 250;
const NODE_H = 112;
const GAP_X = 90;
const GAP_Y = 28;
const PAD = 16;

/** Columns of the plan's nodes: a node sits one column right of its furthest input. */
function layout(nodes) {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const depth = new Map();
  const depthOf = (node, seen = new Set()) => {
    if (depth.has(node.id)) return depth.get(node.id);
    if (seen.has(node.id)) return 0; // a cycle: not in cairn's plans, but never loop
    seen.add(node.id);
    const inputs = (node.inputs || []).map((i) => byId.get(i.id)).filter(Boolean);
    const d = inputs.length === 0 ? 0 : 1 + Math.max(...inputs.map((i) => depthOf(i, seen)));
    depth.set(node.id, d);
    return d;
  };
  const rows = [];
  const at = new Map();
  for (const node of nodes) {
    const col = depthOf(node);
    rows[col] = (rows[col] || 0) + 1;
    at.set(node.id, { col, row: rows[col] - 1 });
  }
  const tallest = Math.max(1, ...rows.filter(Boolean));
  // Center each column vertically against the tallest one.
  for (const [id, p] of at) {
    const offset = ((tallest - rows[p.col]) * (NODE_H + GAP_Y)) / 2;
    at.set(id, {
      x: PAD + p.col * (NODE_W + GAP_X),
      y: PAD + offset + p.row * (NODE_H + GAP_Y),
    });
  }
  return {
    at,
    width: PAD * 2 + rows.length * NODE_W + Math.max(0, rows.length - 1) * GAP_X,
    height: PAD * 2 + tallest * NODE_H + (tallest - 1) * GAP_Y,
  };
}

/** The worst subtask's back-pressure and busy ratios of a vertex's `/backpressure` answer. */
export function backpressureOf(answer) {
  const subtasks = (answer && answer.subtasks) || [];
  const max = (field) => Math.max(0, ...subtasks.map((s) => s[field] || 0));
  return {
    level: (answer && answer.backpressureLevel) || 'unknown',
    ratio: subtasks.length ? max('ratio') : null,
    busy: subtasks.length ? max('busyRatio') : null,
  };
}

export function JobGraph({ plan, vertices, backpressure }) {
  const nodes = (plan && plan.nodes) || [];
  if (nodes.length === 0) return html`<p class="muted">The job has no plan yet.</p>`;
  const { at, width, height } = layout(nodes);
  const metricsOf = (id) => (vertices.find((v) => v.id === id) || {}).metrics || {};
  const edges = nodes.flatMap((node) =>
    (node.inputs || [])
      .filter((input) => at.has(input.id))
      .map((input) => {
        const from = at.get(input.id);
        const to = at.get(node.id);
        const x1 = from.x + NODE_W;
        const y1 = from.y + NODE_H / 2;
        const x2 = to.x;
        const y2 = to.y + NODE_H / 2;
        const bend = (x2 - x1) / 2;
        return {
          key: `${input.id}-${node.id}-${input.num}`,
          path: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`,
          label: input.ship_strategy,
          lx: (x1 + x2) / 2,
          ly: (y1 + y2) / 2 - 6,
        };
      }),
  );
  return html`
    <div class="graph" style=${{ width: `${width}px`, height: `${height}px` }}>
      <svg class="edges" width=${width} height=${height}>
        <defs>
          <marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"
            markerHeight="7" orient="auto-start-reverse">
            <path d="M0,0 L10,5 L0,10 z" />
          </marker>
        </defs>
        ${edges.map(
          (e) => html`<g key=${e.key}>
            <path class="edge" d=${e.path} marker-end="url(#arrow)" />
            <text class="edge-label" x=${e.lx} y=${e.ly} text-anchor="middle">${e.label}</text>
          </g>`,
        )}
      </svg>
      ${nodes.map((node) => {
        const p = at.get(node.id);
        const m = metricsOf(node.id);
        const bp = backpressureOf(backpressure[node.id]);
        return html`
          <div
            key=${node.id}
            class="vertex bp-${bp.level}"
            data-vertex-id=${node.id}
            data-vertex-name=${node.description}
            data-backpressure=${bp.level}
            style=${{ left: `${p.x}px`, top: `${p.y}px`, width: `${NODE_W}px`, height: `${NODE_H}px` }}
          >
            <div class="vertex-name" title=${node.description}>${node.description}</div>
            <div class="vertex-row">
              <span>Parallelism <b>${node.parallelism}</b></span>
              <span class="bp-badge">${bp.level.toUpperCase()}</span>
            </div>
            <div class="vertex-row">
              <span>In <b>${count(m['records-in-per-second'])}/s</b></span>
              <span>Out <b>${count(m['records-out-per-second'])}/s</b></span>
            </div>
            <div class="vertex-row">
              <span>Back-pressured <b>${percent(bp.ratio)}</b></span>
              <span>Busy <b>${percent(bp.busy)}</b></span>
            </div>
          </div>
        `;
      })}
    </div>
  `;
}
