import { describe, expect, it } from 'vitest';
import { servesModel } from '../../src/domain/models.js';

describe('servesModel', () => {
  it('matches the served name, an alias, or the last segment of a path-like served name', () => {
    expect(servesModel('Qwen/Qwen3-27B', [], 'Qwen/Qwen3-27B')).toBe(true);
    expect(servesModel('/models/Qwen3-27B', [], 'Qwen/Qwen3-27B')).toBe(true);
    expect(servesModel('/models/Qwen3-27B/', [], 'Qwen3-27B')).toBe(true);
    expect(servesModel('qwen-prod', ['Qwen/Qwen3-27B'], 'Qwen/Qwen3-27B')).toBe(true);
  });

  it('does not match another model, or a hub name by its last segment alone', () => {
    expect(servesModel('/models/Qwen3-8B', [], 'Qwen/Qwen3-27B')).toBe(false);
    expect(servesModel('other/Qwen3-27B', [], 'Qwen/Qwen3-27B')).toBe(false);
    expect(servesModel(null, [], 'Qwen/Qwen3-27B')).toBe(false);
  });
});
