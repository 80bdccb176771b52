/**
 * What a file is for: OpenAI's `batch`, `batch_output` and `user_data`, and regen's own `regen`
 * (a raw upload) and `run_input` (the inline requests of a run, kept as a file).
 */
export const FILE_PURPOSES = ['batch', 'regen', 'run_input', 'batch_output', 'user_data'] as const;

/**
 * OpenAI's File object. A stored file is ready at once (`processed`, what the SDKs'
 * `waitForProcessing` waits for) and kept until it is deleted or its `expires_at` passes; an
 * expired file keeps its object, `expired: true` (regen's addition), and loses its content.
 */
export function fileObject(f: {
  id: string;
  bytes: number;
  filename: string;
  purpose: string;
  createdAt: number;
  expiresAt?: number | null;
  expiredAt?: number | null;
}) {
  return {
    id: f.id,
    object: 'file' as const,
    bytes: f.bytes,
    filename: f.filename,
    purpose: f.purpose,
    created_at: Math.floor(f.createdAt / 1000),
    expires_at: f.expiresAt == null ? null : Math.floor(f.expiresAt / 1000),
    expired: f.expiredAt != null,
    status: 'processed' as const,
    status_details: null,
  };
}
