import { z } from '@hono/zod-openapi';

export const ErrorCode = z.enum([
  'invalid_request',
  'validation_failed',
  'unauthorized',
  'not_found',
  'method_not_allowed',
  'conflict',
  'payload_too_large',
  'unsupported_media_type',
  'idempotency_conflict',
  'storage_unavailable',
  'internal_error',
]);
export type ErrorCode = z.infer<typeof ErrorCode>;

const statusOf: Record<ErrorCode, number> = {
  invalid_request: 400,
  validation_failed: 422,
  unauthorized: 401,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  payload_too_large: 413,
  unsupported_media_type: 415,
  idempotency_conflict: 409,
  storage_unavailable: 503,
  internal_error: 500,
};

export interface FieldProblem {
  field: string;
  message: string;
}

/** The one error type of the API; rendered as application/problem+json by the app's error handler. */
export class ApiError extends Error {
  readonly status: number;
  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly extra: { field?: string; line?: number; errors?: FieldProblem[] } = {},
  ) {
    super(message);
    this.status = statusOf[code];
  }
}

export const notFound = (what: string, id: string) => new ApiError('not_found', `${what} ${JSON.stringify(id.slice(0, 100))} does not exist`);

export const Problem = z
  .object({
    type: z.string().openapi({ example: 'https://regen.dev/problems/not_found' }),
    title: z.string(),
    status: z.number().int(),
    detail: z.string(),
    code: ErrorCode,
    field: z.string().optional(),
    line: z.number().int().optional(),
    errors: z.array(z.object({ field: z.string(), message: z.string() })).optional(),
    request_id: z.string().optional(),
  })
  .openapi('Problem');
export type Problem = z.infer<typeof Problem>;

const titles: Record<number, string> = {
  400: 'Bad Request',
  401: 'Unauthorized',
  404: 'Not Found',
  405: 'Method Not Allowed',
  409: 'Conflict',
  413: 'Payload Too Large',
  415: 'Unsupported Media Type',
  422: 'Unprocessable Content',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
};

export function problemBody(err: ApiError, requestId?: string, status = err.status): Problem {
  return {
    type: `https://regen.dev/problems/${err.code}`,
    title: titles[status] ?? 'Error',
    status,
    detail: err.message,
    code: err.code,
    ...err.extra,
    ...(requestId ? { request_id: requestId } : {}),
  };
}

/** The standard error responses every route documents. */
export function problemResponses(...statuses: number[]) {
  return Object.fromEntries(statuses.map((s) => [s, { description: titles[s] ?? 'Error', content: { 'application/problem+json': { schema: Problem } } }]));
}

// The OpenAI layer (Files and Batch routes) answers in OpenAI's error shape, which the official
// SDKs read (`e.error.message`, `e.param`), with the problem fields beside it for other clients.

/** OpenAI answers 400 to a parameter it refuses, where regen's own API says 422. */
const openaiStatusOf: Partial<Record<ErrorCode, number>> = { validation_failed: 400 };

export const openaiStatus = (err: ApiError) => openaiStatusOf[err.code] ?? err.status;

export const OpenAIErrorObject = z
  .object({
    message: z.string(),
    type: z.enum(['invalid_request_error', 'server_error']),
    param: z.string().nullable().openapi({ description: 'The request field at fault, when one is' }),
    code: ErrorCode,
  })
  .openapi('OpenAIErrorObject');

export const OpenAIProblem = Problem.extend({ error: OpenAIErrorObject }).openapi('OpenAIProblem', {
  description: "OpenAI's error envelope, with the problem+json fields beside it",
});
export type OpenAIProblem = z.infer<typeof OpenAIProblem>;

export function openaiProblemBody(err: ApiError, requestId?: string): OpenAIProblem {
  const status = openaiStatus(err);
  return {
    ...problemBody(err, requestId, status),
    error: { message: err.message, type: status >= 500 ? 'server_error' : 'invalid_request_error', param: err.extra.field ?? null, code: err.code },
  };
}

/** The error responses of an OpenAI-layer route. */
export function openaiErrorResponses(...statuses: number[]) {
  return Object.fromEntries(
    statuses.map((s) => [s, { description: titles[s] ?? 'Error', content: { 'application/problem+json': { schema: OpenAIProblem } } }]),
  );
}
