// Package gomaxprocs sizes Go's scheduler (GOMAXPROCS) to the proxy's
// load: one thread while the proxy needs less than a core, Go's default
// (the CPUs the process may use, within any container limit) once it needs
// more.
//
// Why: a relay's goroutines wake in bursts, one per client with a request
// or a reply. With two or more scheduler threads each burst also wakes an
// idle thread, which looks for work, mostly finds none and sleeps again;
// on a host the proxy shares with Redis or its clients that thread takes
// the core they wanted. Measured on two cores shared with Redis and
// redis-benchmark (README, Speed): 11.6 µs of proxy CPU per relayed
// request with two threads against 7.9 with one, and 0.66× of the direct
// throughput against 0.91×. One thread serves about a core's worth of
// requests; past that the proxy needs more, and gets them.
//
// The rule, checked every second on the process's CPU time (user and
// system, all threads): at one thread, two seconds in a row at 0.95 of a
// core or more widen it to Go's default; wider, five seconds in a row
// under three quarters of a core narrow it to one. Between the bounds the
// width stays. The two rules never undo each other, because CPU per
// request only falls when the scheduler narrows (by 14% at pipeline depth
// 16 and 32% at depth 1 in README's Speed runs): a load that used less than three quarters of a
// core wide uses less narrow, short of the 0.95 that widens, and a load
// that filled one thread uses more than three quarters wide. The proxy
// starts at Go's default, so that one restarted under load is not held
// to one thread while it finds out.
//
// GOMAXPROCS set in the environment turns the sizing off (the operator's
// number stays), as does a default of one thread. Each change is logged;
// the width is exported as go_sched_gomaxprocs_threads.
package gomaxprocs
