// The REST API as the dashboard uses it: relative paths (so the page works behind a proxy
// prefix), the bearer token from this tab's session storage, Flink's {"errors": [...]} bodies
// turned into Error messages.

const TOKEN_KEY = 'cairn-rest-token';

/** The API answered 401: it needs a (different) bearer token. */
export class Unauthorized extends Error {}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export function hasToken() {
  return sessionStorage.getItem(TOKEN_KEY) !== null;
}

/** Calls the API at `path` (relative, no leading slash); resolves to the JSON body. */
export async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch {
    // An embedded `cairn run --rest` stops answering once its job has ended.
    throw new Error(`cannot reach cairn at ${window.location.host} (has it stopped?)`);
  }
  if (response.status === 401) {
    throw new Unauthorized('the REST API needs a bearer token (--rest-token)');
  }
  const text = await response.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    // Not JSON: the status line says what went wrong.
  }
  if (!response.ok) {
    const errors = json && Array.isArray(json.errors) ? json.errors.join('; ') : '';
    throw new Error(errors || `${method} ${path}: ${response.status} ${response.statusText}`);
  }
  return json;
}
