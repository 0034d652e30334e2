// Package gomaxprocs sizes Go's scheduler (GOMAXPROCS) to the proxy's
// load while it serves: one thread while the proxy needs no more than a
// core, Go's default (the CPUs the process may use; under a container CPU
// limit, the limit rounded up and at least 2) while it needs more.
//
// Why: a relay's goroutines wake in bursts, one per client with a request
// or a reply. With two or more scheduler threads each burst also wakes an
// idle thread, which looks for work, mostly finds none and sleeps again;
// on a host the proxy shares with Redis or its clients that thread takes
// the core they wanted. Measured on two cores shared with Redis and
// redis-benchmark (README, Speed): 43% more proxy CPU per relayed request
// with two threads than with one at pipeline depth 1, and 0.72× the
// throughput; 14% more CPU at depth 16.
//
// The rule, on the process's CPU time (user and system, all threads) read
// every half second:
//
//   - On one thread, a second in a row at 0.95 of a core or more widens the
//     scheduler to Go's default: the one thread is full.
//   - Wide, thirty seconds in a row in which no half second used 1.05
//     cores (more than one thread's worth) narrow it to one thread.
//   - A wide spell that never used 1.05 cores gained nothing: the process
//     may use one core only (a CPU limit of 1, which Go still rounds up to
//     2 threads), or its work costs as much on one thread. The next
//     widening then waits 30 s, doubling with each such spell up to 10
//     minutes; a spell that did use more clears the wait.
//
// So a load that fits in one thread stays on one thread, whatever width it
// started at, and a load that needs more gets more within about a second;
// CPU per request only falls when the scheduler narrows, so a narrowing
// the load undoes at once is one that had gained nothing, and the wait
// bounds how often it recurs. A load in bursts above a core stays wide
// while the bursts keep coming at least every thirty seconds. A host so
// busy that one thread cannot get 0.95 of a core keeps the proxy on one
// thread: there the second thread measured worse, not better. The proxy
// starts at Go's default, so that one restarted under load is not held
// to one thread while it finds out.
//
// GOMAXPROCS set in the environment turns the sizing off (the operator's
// number stays), as does a default of one thread. Each change is logged;
// the width is exported as go_sched_gomaxprocs_threads.
package gomaxprocs
