/** Strips a trailing `/` and `/v1`, so `http://h:30000/v1/` and `http://h:30000` are one endpoint. */
export function normalizeEndpointUrl(raw: string): string {
  const u = new URL(raw);
  u.hash = '';
  u.search = '';
  return u.toString().replace(/\/+$/, '').replace(/\/v1$/, '');
}
