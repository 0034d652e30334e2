// Package hotkey knows which keys the proxy holds as buckets.
//
// A Registry answers "is this key hot, and how?" for every keyed command, so
// it sits on the request path of cold keys too. It is built once from the
// hotkeys.keys rules of proxy.yaml and never changes afterwards: a reload
// builds a new Registry and swaps it in whole, so readers take no lock.
// Exact keys cost one map lookup; glob rules are tried one by one in config
// order, each in time that grows with the key's length (which clients
// choose), so a long list of globs slows every command down — prefer exact
// keys where ops know them.
//
// Match is Redis's own glob matcher (the one behind KEYS and SCAN MATCH),
// reimplemented to give the same answers, so a rule selects exactly the keys
// that KEYS with the same pattern lists. It does not recurse: its time is
// bounded by len(pattern)·len(key) whatever the pattern, where a
// backtracking matcher can take exponential time on patterns such as
// "*a*a*a*a*b" (redis/redis#5660).
//
// Detector finds hot keys in the proxy's own traffic: it counts a sample of
// commands per key, reads and writes apart, in a bounded LRU, and reports
// the keys whose estimated rate passes a threshold (detector.go).
package hotkey
