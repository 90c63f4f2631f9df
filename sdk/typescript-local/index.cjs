'use strict';
// @settle/local for require(); index.mjs is the same class for import.
const client = require('@settle/client');
const { define } = require('./lib/define.cjs');

module.exports = { LocalLedger: define(client), LedgerClosed: client.LedgerClosed };
