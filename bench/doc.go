// Package bench holds marina's benchmarks: reproducible harnesses that run
// the real components and print their numbers. They are not part of
// `make test`; run them with `make bench` (see each benchmark's flags).
package bench
