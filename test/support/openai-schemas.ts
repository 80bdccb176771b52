// OpenAI's own schemas (test/fixtures/openai-openapi, vendored from openai/openai-openapi) as
// validators, to hold regen's OpenAI layer to them.
import { readFileSync } from 'node:fs';
import { Ajv2020, type ErrorObject } from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { parse } from 'yaml';

type Node = Record<string, unknown>;

const FIXTURES = ['schemas.yaml', 'batch-request-output.yaml'];
const REF = '#/components/schemas/';
const ID = 'openai';

const isObject = (n: unknown): n is Node => typeof n === 'object' && n !== null && !Array.isArray(n);

/**
 * The vendored schemas as JSON Schema 2020-12, which OpenAPI 3.1 uses, with three translations:
 *
 * - OpenAPI 3.0's `nullable: true` (batch-request-output.yaml, the last version that published
 *   the batch line schema) becomes a `null` branch; JSON Schema has no such keyword.
 * - A property a schema does not require may be null: OpenAI's API sends null for an absent
 *   optional value, and its schemas do not say so (the Batch object's own example in
 *   schemas.yaml has `"errors": null`, `"failed_at": null`; the batch line's has
 *   `"system_fingerprint": null`). A required property stays as strict as published.
 * - `first_id` and `last_id` of a list may be null: on an empty page there is no id to give,
 *   and OpenAI answers null there too, though ListFilesResponse requires them as strings.
 *
 * `$ref`s are pointed at `$defs`, and OpenAI's annotations (`x-…`, `example`) are left to Ajv as
 * unknown keywords it ignores.
 */
function translate(node: unknown, listIds: boolean): unknown {
  if (Array.isArray(node)) return node.map((n) => translate(n, false));
  if (!isObject(node)) return node;
  const out: Node = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === '$ref' && typeof v === 'string' && v.startsWith(REF)) out.$ref = `#/$defs/${v.slice(REF.length)}`;
    else if (k === 'nullable') continue;
    else if (k === 'properties' && isObject(v)) out.properties = properties(v, (node.required as string[] | undefined) ?? [], listIds);
    else out[k] = translate(v, false);
  }
  return node.nullable === true ? { anyOf: [out, { type: 'null' }] } : out;
}

const orNull = (schema: unknown) => ({ anyOf: [schema, { type: 'null' }] });

function properties(props: Node, required: string[], listIds: boolean): Node {
  const out: Node = {};
  for (const [name, schema] of Object.entries(props)) {
    const t = translate(schema, false);
    const emptyPageId = listIds && (name === 'first_id' || name === 'last_id');
    out[name] = required.includes(name) && !emptyPageId ? t : orNull(t);
  }
  return out;
}

const published: Record<string, Node> = {};
for (const file of FIXTURES) {
  const doc = parse(readFileSync(new URL(`../fixtures/openai-openapi/${file}`, import.meta.url), 'utf8')) as { components: { schemas: Record<string, Node> } };
  Object.assign(published, doc.components.schemas);
}
const LISTS = new Set(['ListFilesResponse', 'ListBatchesResponse']);
const defs = Object.fromEntries(Object.entries(published).map(([name, s]) => [name, translate(s, LISTS.has(name))]));

const ajv = new Ajv2020({ allErrors: true, strict: false });
// ajv-formats is CommonJS with its plugin on `default`, which NodeNext types as the module itself.
addFormats.default(ajv);
// OpenAI's own format for Unix seconds; the `integer` type beside it is what checks them.
ajv.addFormat('unixtime', true);
ajv.addSchema({ $id: ID, $defs: defs });

/** What is wrong with `value` as OpenAI's `schema`, one line an error; empty when it conforms. */
export function openaiViolations(schema: string, value: unknown): string[] {
  if (!(schema in published)) throw new Error(`${schema} is not vendored`);
  const validate = ajv.getSchema(`${ID}#/$defs/${schema}`)!;
  if (validate(value)) return [];
  return (validate.errors as ErrorObject[]).map((e) => `${schema}${e.instancePath} ${e.message} ${JSON.stringify(e.params)}`);
}

/** The properties of OpenAI's `schema` that `value` leaves out: regen gives each, as null when it has none. */
export function missingProperties(schema: string, value: Record<string, unknown>): string[] {
  const props = published[schema]?.properties;
  if (!isObject(props)) throw new Error(`${schema} has no properties`);
  return Object.keys(props).filter((p) => !(p in value));
}
