// The job list: every job the REST API knows, newest first.
import { html } from 'htm/preact';
import { api } from './api.js';
import { usePoll } from './poll.js';
import { millis, time } from './format.js';

export function StateBadge({ state }) {
  return html`<span class="state state-${(state || '').toLowerCase()}" data-state=${state}>
    ${state}
  </span>`;
}

export function ErrorLine({ error }) {
  return error ? html`<p class="error" role="alert">${error.message}</p>` : null;
}

export function JobList() {
  const [jobs] = usePoll(() => api('jobs/overview'), []);
  const list = ((jobs.data && jobs.data.jobs) || [])
    .slice()
    .sort((a, b) => b['start-time'] - a['start-time']);
  return html`
    <section>
      <h1>Jobs</h1>
      <${ErrorLine} error=${jobs.error} />
      ${jobs.data && list.length === 0 && html`<p class="muted">No jobs yet.</p>`}
      ${list.length > 0 &&
      html`<table class="jobs">
        <thead>
          <tr>
            <th>Name</th><th>State</th><th>Started</th><th>Duration</th><th>Restarts</th>
            <th>Tasks</th><th>Job id</th>
          </tr>
        </thead>
        <tbody>
          ${list.map(
            (j) => html`<tr key=${j.jid} class="job-row" data-jid=${j.jid} data-name=${j.name}>
              <td><a href="#/jobs/${j.jid}/overview">${j.name}</a></td>
              <td><${StateBadge} state=${j.state} /></td>
              <td>${time(j['start-time'])}</td>
              <td>${millis(j.duration)}</td>
              <td>${j.restarts}</td>
              <td>${j.tasks.running}/${j.tasks.total} running</td>
              <td><code>${j.jid}</code></td>
            </tr>`,
          )}
        </tbody>
      </table>`}
    </section>
  `;
}
