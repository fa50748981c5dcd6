// Preloaded (node --import) into a client that knows no bearer token: every fetch it makes carries
// `Authorization: Bearer $MCP_TOKEN`, as an operator's client configuration would add it.
const plain = globalThis.fetch;
globalThis.fetch = (input, init = {}) => {
  const headers = new Headers(init.headers || {});
  headers.set('Authorization', 'Bearer ' + process.env.MCP_TOKEN);
  return plain(input, { ...init, headers });
};
