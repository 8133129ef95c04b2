// A line chart of one checkpoint statistic over the checkpoint history, as plain SVG: one
// point per checkpoint (oldest left), the y axis from 0 to the largest value.
import { html } from 'htm/preact';

const W = 318;
const H = 160;
const LEFT = 60;
const RIGHT = 12;
const TOP = 12;
const BOTTOM = 26;

/** `points`: `[{ x: checkpoint id, y: value }]`, oldest first; `format` renders a value. */
export function LineChart({ title, metric, points, format }) {
  const n = points.length;
  const top = Math.max(...points.map((p) => p.y), 0);
  const scale = top > 0 ? top : 1;
  const x = (i) => (n <= 1 ? (LEFT + W - RIGHT) / 2 : LEFT + (i * (W - LEFT - RIGHT)) / (n - 1));
  const y = (v) => TOP + (H - TOP - BOTTOM) * (1 - v / scale);
  const line = points.map((p, i) => `${x(i).toFixed(1)},${y(p.y).toFixed(1)}`).join(' ');
  return html`
    <figure class="chart" data-metric=${metric} data-points=${n}>
      <figcaption>${title}</figcaption>
      <svg viewBox="0 0 ${W} ${H}" width=${W} height=${H} role="img" aria-label=${title}>
        <line class="axis" x1=${LEFT} y1=${TOP} x2=${LEFT} y2=${H - BOTTOM} />
        <line class="axis" x1=${LEFT} y1=${H - BOTTOM} x2=${W - RIGHT} y2=${H - BOTTOM} />
        <line class="grid" x1=${LEFT} y1=${TOP} x2=${W - RIGHT} y2=${TOP} />
        <text class="tick" x=${LEFT - 6} y=${TOP + 4} text-anchor="end">${format(top)}</text>
        <text class="tick" x=${LEFT - 6} y=${H - BOTTOM + 4} text-anchor="end">${format(0)}</text>
        ${n > 0 &&
        html`<text class="tick" x=${LEFT} y=${H - 8}>#${points[0].x}</text>
          <text class="tick" x=${W - RIGHT} y=${H - 8} text-anchor="end">#${points[n - 1].x}</text>`}
        ${n === 0 &&
        html`<text class="empty" x=${(LEFT + W) / 2} y=${H / 2} text-anchor="middle">
          no completed checkpoint yet
        </text>`}
        ${n > 1 && html`<polyline class="line" points=${line} />`}
        ${points.map(
          (p, i) =>
            html`<circle class="point" cx=${x(i)} cy=${y(p.y)} r="3">
              <title>checkpoint ${p.x}: ${format(p.y)}</title>
            </circle>`,
        )}
      </svg>
    </figure>
  `;
}
