// The page imports openapi-fetch from where the server serves its ES module build
// (routes/service/dashboard.ts); to `tsc` that module is the package itself.
export * from 'openapi-fetch';
export { default } from 'openapi-fetch';
