// Package localredis starts throwaway Redis servers on loopback ports for the
// demo command and for end-to-end tests.
//
// A Server is either a real redis-server child process (the default) or an
// embedded in-process miniredis (Options.Embedded). The demo uses
//
//	localredis.Start(localredis.Options{Embedded: !localredis.Available()})
//
// so it needs no setup, while e2e tests always use real redis-server
// processes: miniredis implements most commands but not all of Redis's
// behaviour, so it is never a stand-in for byte-for-byte comparisons.
//
// StartCluster starts a Redis Cluster of real redis-server processes (masters
// with replicas, all slots assigned, cluster_state:ok on every node), for the
// demo and for tests of routing, migration and failover.
//
// A real server runs without persistence (--save "" --appendonly no), so its
// data is gone after Kill or Stop and Restart gives an empty server on the same
// port. An embedded server behaves the same way: Restart makes a fresh
// miniredis.
//
// Warnings:
//   - Start picks a free port by listening on 127.0.0.1:0 and closing the
//     listener, so another process may take the port before redis-server binds
//     it. Start then retries with a new port, and it checks that the server
//     answering PING is its own child (by pid), not a neighbour's.
//   - On Linux the child gets SIGKILL when the thread that started it exits
//     (Pdeathsig), so a crashed or killed test binary leaves no redis-server
//     behind. Go ties this to the OS thread, not the process (Go issue 27505):
//     do not call Start or Restart from a goroutine that exits while locked to
//     its thread with runtime.LockOSThread. On other systems a child can
//     outlive a process that dies without calling Stop.
package localredis
