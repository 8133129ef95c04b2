// cairn's dashboard: the job list, and per job its graph with back-pressure, checkpoints,
// exceptions and savepoints, with buttons to take a savepoint, stop with one, or cancel.
// Pages are addressed by the URL's hash (#/jobs/JID/checkpoints) and poll the REST API.
import { html } from 'htm/preact';
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { api, hasToken, setToken } from './api.js';
import { usePoll, refresh, unauthorized } from './poll.js';
import { JobList } from './jobs.js';
import { JobPage } from './job.js';
import './style.css';

function parseHash() {
  const parts = window.location.hash.replace(/^#\/?/, '').split('/').filter(Boolean);
  if (parts[0] === 'jobs' && parts[1]) {
    return { page: 'job', jid: decodeURIComponent(parts[1]), tab: parts[2] || 'overview' };
  }
  return { page: 'jobs' };
}

function useRoute() {
  const [route, setRoute] = useState(parseHash);
  useEffect(() => {
    const onChange = () => setRoute(parseHash());
    window.addEventListener('hashchange', onChange);
    return () => window.removeEventListener('hashchange', onChange);
  }, []);
  return route;
}

function TokenForm({ onToken }) {
  const [value, setValue] = useState('');
  const submit = (e) => {
    e.preventDefault();
    onToken(value.trim());
  };
  return html`
    <form class="token-form" onSubmit=${submit}>
      <h2>This cairn needs a token</h2>
      <p>
        Its REST API was started with <code>--rest-token</code>. Enter the token to see its jobs;
        it is kept in this browser tab only.
      </p>
      ${hasToken() && html`<p class="error">The token given was refused.</p>`}
      <input
        type="password"
        name="token"
        autocomplete="off"
        placeholder="bearer token"
        value=${value}
        onInput=${(e) => setValue(e.target.value)}
      />
      <button type="submit" disabled=${!value.trim()}>Use token</button>
    </form>
  `;
}

function Header() {
  const [overview] = usePoll(() => api('overview'), []);
  const o = overview.data;
  return html`
    <header class="top">
      <a class="brand" href="#/">cairn</a>
      <nav><a href="#/">Jobs</a></nav>
      ${o &&
      html`<span class="cluster">
        ${o['slots-total'] > 0
          ? `workers ${o.taskmanagers} · slots ${o['slots-available']}/${o['slots-total']} free`
          : 'embedded run'}
        ${` · jobs running ${o['jobs-running']}`}
      </span>`}
    </header>
  `;
}

function App() {
  const route = useRoute();
  const [needToken, setNeedToken] = useState(false);
  // A new token remounts every page, so that each polls again with it.
  const [generation, setGeneration] = useState(0);
  unauthorized.handler = () => setNeedToken(true);
  useEffect(() => {
    api('config')
      .then((c) => {
        if (c && c['refresh-interval'] > 0) refresh.ms = c['refresh-interval'];
      })
      .catch(() => {});
  }, [generation]);
  const useToken = (token) => {
    setToken(token);
    setNeedToken(false);
    setGeneration((g) => g + 1);
  };
  if (needToken) return html`<${TokenForm} onToken=${useToken} />`;
  return html`
    <div key=${generation}>
      <${Header} />
      <main>
        ${route.page === 'job'
          ? html`<${JobPage} key=${route.jid} jid=${route.jid} tab=${route.tab} />`
          : html`<${JobList} />`}
      </main>
    </div>
  `;
}

render(html`<${App} />`, document.getElementById('app'));
