// Reloading data on a timer: every page polls what it shows, so it refreshes itself.
import { useEffect, useState } from 'preact/hooks';
import { Unauthorized } from './api.js';

/** Milliseconds between reloads; `/config`'s refresh-interval once it has loaded. */
export const refresh = { ms: 3000 };

/** Told when the API wants a token, so the app can ask for one. */
export const unauthorized = { handler: () => {} };

/**
 * Runs `load` now and then every `refresh.ms` until the component goes or `deps` change;
 * returns `[{ data, error }, reloadNow]`. A failed reload keeps the last data.
 */
export function usePoll(load, deps) {
  const [state, setState] = useState({ data: null, error: null });
  const [nudge, setNudge] = useState(0);
  useEffect(() => {
    let alive = true;
    let timer = null;
    const run = async () => {
      try {
        const data = await load();
        if (alive) setState({ data, error: null });
      } catch (error) {
        if (!alive) return;
        if (error instanceof Unauthorized) unauthorized.handler();
        setState((s) => ({ data: s.data, error }));
      }
      if (alive) timer = setTimeout(run, refresh.ms);
    };
    run();
    return () => {
      alive = false;
      clearTimeout(timer);
    };
  }, [...deps, nudge]);
  return [state, () => setNudge((n) => n + 1)];
}
