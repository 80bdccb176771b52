/**
 * What a file is for: OpenAI's `batch`, `batch_output` and `user_data`, and regen's own `regen`
 * (a raw upload) and `run_input` (the inline requests of a run, kept as a file).
 */
export const FILE_PURPOSES = ['batch', 'regen', 'run_input', 'batch_output', 'user_data'] as const;
