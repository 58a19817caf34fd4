// Package mooncake tests the mooncake tier (docs/mooncake.md) against a real Mooncake Store
// master and real client processes: two engine processes sharing a pool, a client and the
// master killed mid-transfer, a master restart, pool-full eviction. Its tests need the build
// tag `mooncake` and a Mooncake build (tools/mooncake/build.sh); `make test-mooncake` runs them
// through tools/mooncake/harness.sh, which leaves nothing running. All traffic is on loopback.
package mooncake
