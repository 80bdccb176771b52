// Which of the server's OpenAI routes a run's requests go to (README "OpenAI Batch API"). A run's
// lines take the shape of its endpoint's requests: chat messages, a raw prompt, or an input to embed.

export const RUN_ENDPOINTS = ['/v1/chat/completions', '/v1/completions', '/v1/embeddings'] as const;
export type RunEndpoint = (typeof RUN_ENDPOINTS)[number];
export const DEFAULT_RUN_ENDPOINT: RunEndpoint = '/v1/chat/completions';

/** A run's endpoint as stored (null on runs made before the field existed: chat). */
export const runEndpoint = (stored: string | null | undefined): RunEndpoint =>
  (RUN_ENDPOINTS as readonly string[]).includes(stored ?? '') ? (stored as RunEndpoint) : DEFAULT_RUN_ENDPOINT;

/**
 * Batch endpoints OpenAI takes that regen refuses, with why: SGLang serves `/v1/responses`, but its
 * answers (output items, tool and reasoning state kept by the server) are no chat completion regen
 * can check or write as training data.
 */
export function unsupportedEndpointMessage(endpoint: string): string {
  return `${JSON.stringify(endpoint.slice(0, 100))} is not supported: regen runs ${RUN_ENDPOINTS.map((e) => `"${e}"`).join(', ')}`;
}

/** How an embedding goes out: as floats, or OpenAI's base64 of its little-endian float32s. */
export type EncodingFormat = 'float' | 'base64';

export function encodeEmbedding(embedding: readonly number[], format: EncodingFormat): number[] | string {
  if (format === 'float') return embedding as number[];
  const bytes = Buffer.alloc(embedding.length * 4);
  for (const [i, v] of embedding.entries()) bytes.writeFloatLE(v, i * 4);
  return bytes.toString('base64');
}

/** The encoding a request's params ask for (OpenAI's default, floats, when they name none). */
export const encodingOf = (params: Record<string, unknown> | undefined | null): EncodingFormat => (params?.encoding_format === 'base64' ? 'base64' : 'float');
