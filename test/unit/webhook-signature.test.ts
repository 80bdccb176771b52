import { describe, expect, it } from 'vitest';
import { isWebhookSecret, runEvent, signatureHeaders } from '../../src/domain/webhooks.js';

// The test vector the Standard Webhooks specification's libraries share: matching it is what lets
// a receiver verify regen's events with any of them.
const VECTOR = {
  secret: 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw',
  id: 'msg_p5jXN8AQM9LWM0D4loKWxJek',
  timestamp: 1614265330,
  body: '{"test": 2432232314}',
  signature: 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=',
};

describe('webhook signatures', () => {
  it('reproduce the Standard Webhooks test vector', () => {
    expect(signatureHeaders(VECTOR.secret, VECTOR.id, VECTOR.timestamp, VECTOR.body)).toEqual({
      'webhook-id': VECTOR.id,
      'webhook-timestamp': String(VECTOR.timestamp),
      'webhook-signature': VECTOR.signature,
    });
  });

  it('change with any signed part', () => {
    const sig = (id: string, ts: number, body: string) => signatureHeaders(VECTOR.secret, id, ts, body)['webhook-signature'];
    expect(sig('msg_other', VECTOR.timestamp, VECTOR.body)).not.toBe(VECTOR.signature);
    expect(sig(VECTOR.id, VECTOR.timestamp + 1, VECTOR.body)).not.toBe(VECTOR.signature);
    expect(sig(VECTOR.id, VECTOR.timestamp, '{"test": 2432232315}')).not.toBe(VECTOR.signature);
  });

  it('take only whsec_ secrets of 24 to 64 bytes', () => {
    const b64 = (n: number) => Buffer.alloc(n, 7).toString('base64');
    expect(isWebhookSecret(VECTOR.secret)).toBe(true);
    expect(isWebhookSecret(`whsec_${b64(64)}`)).toBe(true);
    expect(isWebhookSecret(`whsec_${b64(23)}`)).toBe(false);
    expect(isWebhookSecret(`whsec_${b64(65)}`)).toBe(false);
    expect(isWebhookSecret(b64(32))).toBe(false);
    expect(isWebhookSecret('whsec_not base64 at all, but long enough!!')).toBe(false);
  });
});

describe('run events', () => {
  const run = { id: 'run_1', batchId: null, expiredAt: null, dryRun: false };

  it("mark a dry run's, whose completion is a forecast and no output to take", () => {
    expect(runEvent(run, 'completed', null)).toEqual({ type: 'run.completed', data: { id: 'run_1', status_reason: null } });
    expect(runEvent({ ...run, dryRun: true }, 'completed', null).data).toMatchObject({ dry_run: true });
  });
});
