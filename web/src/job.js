// One job: its header with the actions, and the tabs Overview (graph and vertices),
// Checkpoints, Exceptions and Savepoints.
import { html } from 'htm/preact';
import { useState } from 'preact/hooks';
import { api } from './api.js';
import { usePoll } from './poll.js';
import { bytes, count, millis, percent, time } from './format.js';
import { ErrorLine, StateBadge } from './jobs.js';
import { JobGraph, backpressureOf } from './graph.js';
import { LineChart } from './chart.js';

const TERMINAL = ['FINISHED', 'CANCELED', 'FAILED'];
const TABS = [
  ['overview', 'Overview'],
  ['checkpoints', 'Checkpoints'],
  ['exceptions', 'Exceptions'],
  ['savepoints', 'Savepoints'],
];

/** Polls an asynchronous operation (`savepoints/:rid`) until it completes or fails. */
async function awaitOperation(path) {
  for (;;) {
    const answer = await api(path);
    if (answer.status && answer.status.id === 'COMPLETED') return answer.operation || {};
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}

function Actions({ jid, state, onChange }) {
  const [config] = usePoll(() => api(`jobs/${jid}/config`), [jid]);
  const [dir, setDir] = useState(null);
  const [result, setResult] = useState(null);
  const [busy, setBusy] = useState(false);
  const configured =
    (config.data && config.data['execution-config']['user-config']['state.savepoints.dir']) || '';
  const target = dir === null ? configured : dir;
  const ended = TERMINAL.includes(state);
  const run = async (what, action) => {
    setBusy(true);
    setResult({ status: 'running', text: `${what}…` });
    try {
      const text = await action();
      setResult({ status: 'ok', text });
    } catch (error) {
      setResult({ status: 'error', text: `${what} failed: ${error.message}` });
    } finally {
      setBusy(false);
      onChange();
    }
  };
  const savepoint = (stop) =>
    run(stop ? 'Stop with savepoint' : 'Savepoint', async () => {
      const body = stop
        ? { targetDirectory: target || null, drain: false }
        : { 'target-directory': target || null, 'cancel-job': false };
      const path = stop ? `jobs/${jid}/stop` : `jobs/${jid}/savepoints`;
      const { 'request-id': rid } = await api(path, { method: 'POST', body });
      onChange();
      const operation = await awaitOperation(`jobs/${jid}/savepoints/${rid}`);
      return stop
        ? `Stopped with a savepoint at ${operation.location}`
        : `Savepoint completed at ${operation.location}`;
    });
  const stop = () => {
    if (window.confirm('Stop the job with a savepoint? Its sources stop and it ends FINISHED.')) {
      savepoint(true);
    }
  };
  const cancel = () => {
    if (!window.confirm('Cancel the job? It ends CANCELED without a savepoint.')) return;
    run('Cancel', async () => {
      await api(`jobs/${jid}?mode=cancel`, { method: 'PATCH' });
      return 'Cancel requested';
    });
  };
  return html`
    <div class="actions">
      <label>
        Savepoint directory
        <input
          name="target-directory"
          placeholder="state.savepoints.dir"
          value=${target}
          onInput=${(e) => setDir(e.target.value)}
          disabled=${ended}
        />
      </label>
      <button name="savepoint" onClick=${() => savepoint(false)} disabled=${ended || busy}>
        Trigger savepoint
      </button>
      <button name="stop" onClick=${stop} disabled=${ended || busy}>Stop with savepoint</button>
      <button name="cancel" class="danger" onClick=${cancel} disabled=${ended || busy}>
        Cancel job
      </button>
      ${result &&
      html`<p class="action-result result-${result.status}" data-status=${result.status}>
        ${result.text}
      </p>`}
    </div>
  `;
}

function OverviewTab({ jid, job }) {
  const vertices = job.vertices || [];
  const ids = vertices.map((v) => v.id).join(',');
  const [bp] = usePoll(async () => {
    const answers = await Promise.all(
      vertices.map((v) => api(`jobs/${jid}/vertices/${v.id}/backpressure`)),
    );
    return Object.fromEntries(vertices.map((v, i) => [v.id, answers[i]]));
  }, [jid, ids]);
  const backpressure = bp.data || {};
  return html`
    <section>
      <h2>Job graph</h2>
      <${ErrorLine} error=${bp.error} />
      <div class="graph-scroll">
        <${JobGraph} plan=${job.plan} vertices=${vertices} backpressure=${backpressure} />
      </div>
      <h2>Vertices</h2>
      <table class="vertices">
        <thead>
          <tr>
            <th>Name</th><th>Status</th><th>Parallelism</th><th>Records in/s</th>
            <th>Records out/s</th><th>Records received</th><th>Records sent</th>
            <th>Bytes received</th><th>Bytes sent</th><th>Back-pressure</th><th>Busy</th>
          </tr>
        </thead>
        <tbody>
          ${vertices.map((v) => {
            const m = v.metrics || {};
            const b = backpressureOf(backpressure[v.id]);
            return html`<tr key=${v.id} data-vertex-name=${v.name}>
              <td>${v.name}</td>
              <td><${StateBadge} state=${v.status} /></td>
              <td>${v.parallelism}</td>
              <td>${count(m['records-in-per-second'])}</td>
              <td>${count(m['records-out-per-second'])}</td>
              <td>${count(m['read-records'])}</td>
              <td>${count(m['write-records'])}</td>
              <td>${bytes(m['read-bytes'])}</td>
              <td>${bytes(m['write-bytes'])}</td>
              <td><span class="bp-text bp-${b.level}">${b.level.toUpperCase()}</span>
                ${' '}${percent(b.ratio)}</td>
              <td>${percent(b.busy)}</td>
            </tr>`;
          })}
        </tbody>
      </table>
    </section>
  `;
}

/** The largest alignment of any subtask of a checkpoint, in ms. */
function alignmentOf(checkpoint) {
  return Math.max(0, ...(checkpoint.subtasks || []).map((s) => s.alignment_ms || 0));
}

function CheckpointsTab({ jid }) {
  const [ck] = usePoll(() => api(`jobs/${jid}/checkpoints`), [jid]);
  const data = ck.data;
  if (!data) return html`<${ErrorLine} error=${ck.error} />`;
  const history = (data.history || []).slice().reverse(); // oldest first
  const series = (f) => history.map((c) => ({ x: c.id, y: f(c) }));
  const latest = data.latest && data.latest.completed;
  const c = data.counts;
  return html`
    <section>
      <${ErrorLine} error=${ck.error} />
      <div class="counts">
        <span>Triggered <b>${c.triggered}</b></span>
        <span>Completed <b data-count="completed">${c.completed}</b></span>
        <span>In progress <b>${c.in_progress}</b></span>
        <span>Failed <b>${c.failed}</b></span>
        <span>Restored <b>${c.restored}</b></span>
      </div>
      <div class="charts">
        <${LineChart} title="Duration" metric="duration" format=${millis}
          points=${series((x) => x.end_to_end_duration)} />
        <${LineChart} title="Checkpointed size" metric="size" format=${bytes}
          points=${series((x) => x.checkpointed_size)} />
        <${LineChart} title="Alignment (slowest subtask)" metric="alignment" format=${millis}
          points=${series(alignmentOf)} />
        <${LineChart} title="In-flight data persisted" metric="in-flight" format=${bytes}
          points=${series((x) => x.persisted_data)} />
      </div>
      <h2>Latest completed checkpoint${latest ? ` #${latest.id}` : ''}</h2>
      ${latest
        ? html`<p class="muted">
              ${latest.checkpoint_type} · ${millis(latest.end_to_end_duration)} ·
              ${bytes(latest.checkpointed_size)} · ${time(latest.latest_ack_timestamp)} ·
              <code>${latest.external_path || ''}</code>
            </p>
            <table class="subtasks">
              <thead>
                <tr>
                  <th>Task</th><th>Subtask</th><th>Start delay</th><th>Alignment</th>
                  <th>Sync</th><th>Async</th><th>State size</th><th>In-flight</th>
                  <th>Unaligned</th>
                </tr>
              </thead>
              <tbody>
                ${(latest.subtasks || []).map(
                  (s) => html`<tr key=${`${s.task}-${s.subtask}`}>
                    <td>${s.task}</td>
                    <td>${s.subtask}</td>
                    <td>${millis(s.start_delay_ms)}</td>
                    <td>${millis(s.alignment_ms)}</td>
                    <td>${millis(s.sync_ms)}</td>
                    <td>${millis(s.async_ms)}</td>
                    <td>${bytes(s.state_size)}</td>
                    <td>${bytes(s.channel_state_size)}</td>
                    <td>${s.unaligned ? 'yes' : 'no'}</td>
                  </tr>`,
                )}
              </tbody>
            </table>`
        : html`<p class="muted">None yet.</p>`}
      <h2>History</h2>
      <table class="history">
        <thead>
          <tr>
            <th>Id</th><th>Type</th><th>Triggered</th><th>Duration</th><th>Size</th>
            <th>In-flight</th><th>Subtasks</th>
          </tr>
        </thead>
        <tbody>
          ${(data.history || []).map(
            (h) => html`<tr key=${h.id}>
              <td>${h.id}</td>
              <td>${h.checkpoint_type}</td>
              <td>${time(h.trigger_timestamp)}</td>
              <td>${millis(h.end_to_end_duration)}</td>
              <td>${bytes(h.checkpointed_size)}</td>
              <td>${bytes(h.persisted_data)}</td>
              <td>${h.num_acknowledged_subtasks}/${h.num_subtasks}</td>
            </tr>`,
          )}
        </tbody>
      </table>
    </section>
  `;
}

function ExceptionsTab({ jid, job }) {
  const [ex] = usePoll(() => api(`jobs/${jid}/exceptions`), [jid]);
  const entries = (ex.data && ex.data.exceptionHistory.entries) || [];
  const causes = Object.entries(job['restart-causes'] || {});
  return html`
    <section>
      <${ErrorLine} error=${ex.error} />
      <p class="counts">
        <span>Restarts <b>${job.restarts}</b></span>
        ${causes.map(([cause, n]) => html`<span key=${cause}>${cause} <b>${n}</b></span>`)}
      </p>
      ${ex.data && entries.length === 0 && html`<p class="muted">No exceptions.</p>`}
      ${entries.length > 0 &&
      html`<table class="exceptions">
        <thead><tr><th>Time</th><th>Kind</th><th>Restarted</th><th>Cause</th></tr></thead>
        <tbody>
          ${entries.map(
            (e, i) => html`<tr key=${i}>
              <td>${time(e.timestamp)}</td>
              <td>${e.kind}</td>
              <td>${e.restarted ? 'yes' : 'no'}</td>
              <td><pre>${e.stacktrace}</pre></td>
            </tr>`,
          )}
        </tbody>
      </table>`}
    </section>
  `;
}

function SavepointsTab({ jid }) {
  const [ck] = usePoll(() => api(`jobs/${jid}/checkpoints`), [jid]);
  const savepoints = (ck.data && ck.data.savepoints) || [];
  return html`
    <section>
      <${ErrorLine} error=${ck.error} />
      ${ck.data && savepoints.length === 0 &&
      html`<p class="muted">No savepoint of this job was requested while it ran here.</p>`}
      ${savepoints.length > 0 &&
      html`<table class="savepoints">
        <thead><tr><th>Requested</th><th>Kind</th><th>Status</th><th>Location or cause</th></tr></thead>
        <tbody>
          ${savepoints.map(
            (s) => html`<tr key=${s['request-id']} class="savepoint" data-status=${s.status}
              data-kind=${s.kind}>
              <td>${time(s.trigger_timestamp)}</td>
              <td>${s.kind === 'stop' ? 'stop with savepoint' : 'savepoint'}</td>
              <td>${s.status}</td>
              <td><code>${s.location || s.cause || ''}</code></td>
            </tr>`,
          )}
        </tbody>
      </table>`}
    </section>
  `;
}

export function JobPage({ jid, tab }) {
  const [job, reload] = usePoll(() => api(`jobs/${jid}`), [jid]);
  const j = job.data;
  if (!j) {
    return html`<section><${ErrorLine} error=${job.error} />
      ${!job.error && html`<p class="muted">Loading job ${jid}…</p>`}</section>`;
  }
  const active = TABS.some(([id]) => id === tab) ? tab : 'overview';
  const Tab = {
    overview: OverviewTab,
    checkpoints: CheckpointsTab,
    exceptions: ExceptionsTab,
    savepoints: SavepointsTab,
  }[active];
  return html`
    <section class="job" data-jid=${jid}>
      <div class="job-head">
        <h1>${j.name}</h1>
        <${StateBadge} state=${j.state} />
        <span class="muted">
          <code>${jid}</code> · started ${time(j['start-time'])} · ${millis(j.duration)} ·
          restarts ${j.restarts}
        </span>
      </div>
      <${ErrorLine} error=${job.error} />
      ${j['failure-cause'] &&
      html`<p class=${j.state === 'FAILED' ? 'error' : 'muted'}>
        ${j.state === 'FAILED' ? 'Failed' : 'Last failure (restarted)'}: ${j['failure-cause']}
      </p>`}
      <${Actions} jid=${jid} state=${j.state} onChange=${reload} />
      <nav class="tabs">
        ${TABS.map(
          ([id, label]) => html`<a key=${id} href="#/jobs/${jid}/${id}" data-tab=${id}
            class=${id === active ? 'active' : ''}>${label}</a>`,
        )}
      </nav>
      <${Tab} jid=${jid} job=${j} />
    </section>
  `;
}
