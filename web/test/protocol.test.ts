import { test } from "node:test";
import assert from "node:assert/strict";
export {};
test("placeholder", () => assert.ok(true));
