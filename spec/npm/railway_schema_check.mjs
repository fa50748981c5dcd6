// Checks GraphQL requests against the part of Railway's public schema that sandboxes use
// (spec/support/railway_schema.graphql), with the `graphql` package (the reference
// implementation, which the official `railway` SDK itself depends on):
//
//   node spec/npm/railway_schema_check.mjs <schema.graphql> <requests.json>
//
// requests.json is a list of { query, variables }: each document must parse and validate
// against the schema (its fields, arguments, types and selections), and its variables must be
// values of the types it declares. Prints `RESULT {json}`: { checked, errors: [text] }.
import { readFileSync } from 'node:fs';
import { buildSchema, parse, validate, getVariableValues, Kind } from 'graphql';

const [schemaFile, requestsFile] = process.argv.slice(2);
const schema = buildSchema(readFileSync(schemaFile, 'utf8'));
const requests = JSON.parse(readFileSync(requestsFile, 'utf8'));
const errors = [];
for (const { query, variables } of requests) {
  const name = (query.match(/^\s*(?:query|mutation)\s+(\w+)/) ?? [])[1] ?? query.slice(0, 60);
  let doc;
  try { doc = parse(query); } catch (e) { errors.push(`${name}: ${e.message}`); continue; }
  const invalid = validate(schema, doc);
  for (const e of invalid) errors.push(`${name}: ${e.message}`);
  if (invalid.length > 0) continue;
  const op = doc.definitions.find((d) => d.kind === Kind.OPERATION_DEFINITION);
  const coerced = getVariableValues(schema, op.variableDefinitions ?? [], variables ?? {});
  for (const e of coerced.errors ?? []) errors.push(`${name}: ${e.message}`);
}
console.log('RESULT ' + JSON.stringify({ checked: requests.length, errors }));
