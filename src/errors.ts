import { z } from '@hono/zod-openapi';

export const ErrorCode = z.enum([
  'invalid_request',
  'validation_failed',
  'unauthorized',
  'not_found',
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
  409: 'Conflict',
  413: 'Payload Too Large',
  415: 'Unsupported Media Type',
  422: 'Unprocessable Content',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
};

export function problemBody(err: ApiError, requestId?: string): Problem {
  return {
    type: `https://regen.dev/problems/${err.code}`,
    title: titles[err.status] ?? 'Error',
    status: err.status,
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
