import { describe, expect, it } from 'vitest';
import { move, type Life } from '../../src/runner/life.js';

describe("the runner's life", () => {
  it('goes from idle through running to stopped', () => {
    let life: Life = 'idle';
    for (const next of ['starting', 'running', 'stopping', 'stopped'] as const) life = move(life, next);
    expect(life).toBe('stopped');
  });

  it('may stop from any state before stopping, and from nowhere after', () => {
    for (const from of ['idle', 'starting', 'running'] as const) expect(move(from, 'stopping')).toBe('stopping');
    expect(() => move('stopped', 'starting')).toThrow(/from stopped to starting/);
    expect(() => move('stopping', 'running')).toThrow(/from stopping to running/);
    expect(() => move('idle', 'running')).toThrow(/from idle to running/);
  });
});
