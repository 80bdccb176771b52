/** Strips a trailing `/` and `/v1`, so `http://h:30000/v1/` and `http://h:30000` are one endpoint. */
export function normalizeEndpointUrl(raw: string): string {
  const u = new URL(raw);
  u.hash = '';
  u.search = '';
  return u.toString().replace(/\/+$/, '').replace(/\/v1$/, '');
}

// The rules for a URL regen sends requests to on a user's word: an endpoint's, and a webhook's.

export const NOT_HTTP_MESSAGE = 'expected an http:// or https:// base URL without credentials';
export const METADATA_HOST_MESSAGE = 'link-local and cloud metadata addresses are not allowed';

/** An http(s) URL that carries no user name or password. */
export function isHttpUrlWithoutCredentials(raw: string): boolean {
  try {
    const u = new URL(raw);
    return (u.protocol === 'http:' || u.protocol === 'https:') && !u.username && !u.password;
  } catch {
    return false;
  }
}

/**
 * `[::ffff:a9fe:a9fe]` (IPv4-mapped) and `[::a9fe:a9fe]` (IPv4-compatible) → `169.254.169.254`:
 * the URL parser writes both in hex.
 */
function embeddedIpv4(host: string): string | null {
  const m = /^\[::(?:ffff:)?([0-9a-f]{1,4}):([0-9a-f]{1,4})\]$/i.exec(host);
  if (!m) return null;
  const [hi, lo] = [parseInt(m[1], 16), parseInt(m[2], 16)];
  return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
}

// The clouds' instance metadata services, by the names and addresses they publish: link-local
// 169.254.0.0/16 and fe80::/10 (AWS, Azure, GCP, most others), AWS's IPv6 fd00:ec2::254, Alibaba's
// 100.100.100.200, and GCP's names. Never an inference server nor a webhook receiver.
const METADATA_NAMES = new Set(['metadata.google.internal', 'metadata', '100.100.100.200', '[fd00:ec2::254]']);

function isMetadataHost(hostname: string): boolean {
  // A trailing dot names the same host (a fully qualified name).
  const host = (embeddedIpv4(hostname) ?? hostname).toLowerCase().replace(/\.$/, '');
  return /^169\.254\./.test(host) || /^\[fe[89ab][0-9a-f]?:/.test(host) || METADATA_NAMES.has(host);
}

/** False for a URL that does not parse, as well as for one naming a metadata host. */
export function isAllowedHost(raw: string): boolean {
  try {
    return !isMetadataHost(new URL(raw).hostname);
  } catch {
    return false;
  }
}

/** Why regen will not send to this URL, or null when it may. */
export function urlProblem(raw: string): string | null {
  if (!isHttpUrlWithoutCredentials(raw)) return NOT_HTTP_MESSAGE;
  if (!isAllowedHost(raw)) return METADATA_HOST_MESSAGE;
  return null;
}
