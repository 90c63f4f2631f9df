// @settle/local for import; index.cjs is the same class for require().
import * as client from '@settle/client';
import shared from './lib/define.cjs';

export const LocalLedger = shared.define(client);
export const LedgerClosed = client.LedgerClosed;
