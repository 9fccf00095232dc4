// A site behind the stock prerender-node middleware, set up as its README says and nothing
// more: no hooks. Crawlers (prerender-node's own User-Agent list) get what the prerender
// service at PRERENDER_SERVICE_URL answers (sent with PRERENDER_TOKEN); everyone else, and any request carrying
// X-Prerender (a render, or lanes serve fetching the origin's answer), gets the site at ORIGIN.
// PORT 0 listens on any free port; the port is printed on stdout.
const express = require('express');
const prerender = require('prerender-node');
const { createProxyMiddleware } = require('http-proxy-middleware');

const app = express();
app.use(prerender); // reads PRERENDER_SERVICE_URL and PRERENDER_TOKEN
app.use(createProxyMiddleware({ target: process.env.ORIGIN }));

const server = app.listen(Number(process.env.PORT || 0), '127.0.0.1', () => {
  console.log(`listening on ${server.address().port}`);
});
process.on('SIGTERM', () => {
  server.close(() => process.exit(0));
  server.closeAllConnections();
});
