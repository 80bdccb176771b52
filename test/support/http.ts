import { expect } from 'vitest';

/** A response with its raw text kept, to assert on what exactly went over the wire. */
export interface Raw {
  status: number;
  headers: Headers;
  text: string;
  body: any;
}

export async function request(base: string, path: string, init: RequestInit & { json?: unknown; duplex?: 'half' } = {}): Promise<Raw> {
  const { json, ...rest } = init;
  const res = await fetch(base + path, {
    ...rest,
    ...(json !== undefined ? { body: JSON.stringify(json), headers: { 'content-type': 'application/json', ...(rest.headers as object) } } : {}),
  });
  const text = await res.text();
  let body: unknown = null;
  try {
    body = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, headers: res.headers, text, body };
}

/**
 * Every error is problem+json with a code and a detail naming the field at fault, and leaks no
 * stack, exception text or any of the `hidden` strings (the server's paths).
 */
export function expectProblem(res: Raw, status: number, opts: { code?: string; field?: string; hidden?: string[] } = {}): void {
  expect(res.status, res.text).toBe(status);
  expect(res.headers.get('content-type')).toMatch(/^application\/problem\+json/);
  expect(typeof res.body?.code).toBe('string');
  expect(typeof res.body?.detail).toBe('string');
  if (opts.code) expect(res.body.code).toBe(opts.code);
  if (opts.field) {
    expect(res.body.field).toBe(opts.field);
    expect(res.body.detail).toContain(opts.field);
  }
  for (const h of opts.hidden ?? []) expect(res.text).not.toContain(h);
  expect(res.text).not.toContain('at /');
  expect(res.text).not.toContain('.ts:');
  expect(res.text).not.toContain('Error:');
}
