import type { Deps } from '../../deps.js';
import type { DbOrTx } from '../../db/client.js';
import { servedModels } from '../../db/endpoints.js';
import { closestModels, servesModel } from '../../domain/models.js';
import { newId } from '../../ids.js';
import { checkAnswerBuffer, checkCalibration, checkExpiry, checkInput, checkRawEndpoint, checkSamplesPerLine, type NewRun } from './create.js';
import { outputUriFor } from './output-location.js';

/** Something in a run's request that looks wrong but does not stop the run. */
export interface RunWarning {
  code: 'model_not_served';
  field: string;
  message: string;
  /** The served names closest to the one asked for, best first. */
  suggestions: string[];
}

/** Shown at most in a warning's list of what the endpoints serve. */
const MAX_LISTED_MODELS = 10;

const quote = (names: string[]) => names.map((n) => JSON.stringify(n)).join(', ');

/**
 * A warning when no registered endpoint serves the run's model. None while an endpoint has not said
 * what it serves (an SGLang server loading its weights): it may be the one.
 */
export async function modelWarnings(db: DbOrTx, model: string): Promise<RunWarning[]> {
  const endpoints = await servedModels(db);
  if (endpoints.some((e) => e.model === null || servesModel(e.model, e.aliases, model))) return [];
  const served = [...new Set(endpoints.flatMap((e) => [e.model as string, ...e.aliases]))];
  const suggestions = closestModels(model, served);
  const asked = `model ${JSON.stringify(model.slice(0, 100))} is not served by any registered endpoint`;
  let hint: string;
  if (suggestions.length > 0) hint = `did you mean ${quote(suggestions)}?`;
  else if (served.length > 0) hint = `the endpoints serve ${quote(served.slice(0, MAX_LISTED_MODELS))}${served.length > MAX_LISTED_MODELS ? ', …' : ''}`;
  else hint = 'no endpoint is registered yet: regen endpoints add URL';
  return [{ code: 'model_not_served', field: 'model', message: `${asked} (${hint}); the run waits until an endpoint serves it`, suggestions }];
}

/** A run's body as the validate route takes it: the input may be left out, to be checked before its upload. */
export type RunDraft = Omit<NewRun, 'input'> & { input?: NewRun['input'] };

/**
 * Checks a run's body as createRun does, storing nothing: throws the same ApiError the create would,
 * else returns the warnings the run would carry. Inline requests' lines are read only once the run
 * is created, as any input's.
 */
export async function validateRun(deps: Deps, body: RunDraft): Promise<RunWarning[]> {
  checkCalibration(body);
  checkSamplesPerLine(body);
  checkRawEndpoint(body);
  checkExpiry(body.output?.expires_after?.seconds, 'output.expires_after.seconds', deps.config.minExpirySeconds);
  checkAnswerBuffer(body, deps.config.answerBufferBytes);
  if (body.input && !('requests' in body.input)) await checkInput(deps, body.input);
  await outputUriFor(deps, newId('run'), body);
  return await modelWarnings(deps.db, body.model);
}
