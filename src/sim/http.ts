import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';

/** An error answered with SGLang's error body and this status. */
export class SimHttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    /** SGLang's `type`; by default derived from the status. FastAPI validation errors say "Bad Request". */
    readonly type?: string,
  ) {
    super(message);
  }
}

const ERROR_TYPES: Record<number, string> = {
  400: 'BadRequestError',
  413: 'BadRequestError',
  500: 'InternalServerError',
  503: 'ServiceUnavailableError',
};

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: OutgoingHttpHeaders = {}): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(payload),
    ...headers,
  });
  res.end(payload);
}

export function sendText(res: ServerResponse, status: number, text: string, contentType = 'text/plain'): void {
  res.writeHead(status, { 'content-type': contentType, 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

/** FastAPI's answer for a route that does not exist (or a method it does not take). */
export function sendDetail(res: ServerResponse, status: 404 | 405, detail: string): void {
  sendJson(res, status, { detail });
}

/** SGLang's error body: `{"object":"error","message","type","param","code"}`. */
export function sendError(res: ServerResponse, status: number, message: string, errorType?: string): void {
  const type = errorType ?? ERROR_TYPES[status] ?? (status >= 500 ? 'InternalServerError' : 'BadRequestError');
  sendJson(res, status, { object: 'error', message, type, param: null, code: status });
}

export function readJson(req: IncomingMessage, limitBytes: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let ended = false;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size <= limitBytes) chunks.push(chunk);
    });
    req.on('end', () => {
      ended = true;
      if (size > limitBytes) return reject(new SimHttpError(413, `The request body is larger than ${limitBytes} bytes.`));
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch {
        reject(new SimHttpError(400, 'The request body is not valid JSON.'));
      }
    });
    // A client that hangs up mid-body never sends 'end'; settle so nothing waits forever. Every
    // request closes in the end: the error (and its stack) is made only for one cut short.
    req.on('close', () => {
      if (!ended) reject(new SimHttpError(400, 'The client closed the connection.'));
    });
  });
}
