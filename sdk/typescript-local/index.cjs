'use strict';
// @settle/local for require(); index.mjs is the same class for import.
const { Client } = require('@settle/client');
const { define } = require('./lib/define.cjs');

module.exports = { LocalLedger: define(Client) };
