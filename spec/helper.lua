-- Loaded by busted before the specs: shared helpers live in spec/support/util.lua.
package.path = 'spec/?.lua;' .. package.path
