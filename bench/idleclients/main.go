// Command idleclients opens many Redis connections and holds them idle, to
// measure what an idle client costs a server or proxy.
//
//	idleclients [-addr 127.0.0.1:6380] [-n 10000] [-hold 10m]
//
// Each connection sends PING and must read +PONG. When all are connected it
// prints a line starting with "ready", then holds them until SIGINT or
// SIGTERM or until -hold has passed. Before closing it sends PING on every
// connection again and reports how many still answer, which shows whether
// the server dropped idle clients. Exit status 1 if a connection failed.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	ping = []byte("*1\r\n$4\r\nPING\r\n")
	pong = []byte("+PONG\r\n")
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6380", "server address host:port")
	n := flag.Int("n", 10000, "connections to open")
	workers := flag.Int("dialers", 64, "connections opened in parallel")
	dialTimeout := flag.Duration("dial-timeout", 5*time.Second, "time allowed for one connect and PING")
	hold := flag.Duration("hold", 10*time.Minute, "hold the connections this long, then exit (0: until a signal)")
	recheck := flag.Bool("recheck", true, "PING every connection again before closing")
	flag.Parse()
	if *n < 1 || *workers < 1 {
		fmt.Fprintln(os.Stderr, "idleclients: -n and -dialers must be >= 1")
		os.Exit(2)
	}
	os.Exit(run(*addr, *n, *workers, *dialTimeout, *hold, *recheck))
}

func run(addr string, n, workers int, dialTimeout, hold time.Duration, recheck bool) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	start := time.Now()
	conns := make([]net.Conn, n)
	errs := forEach(ctx, n, workers, func(i int) error {
		c, err := net.DialTimeout("tcp", addr, dialTimeout)
		if err != nil {
			return err
		}
		if err := pingPong(c, dialTimeout); err != nil {
			c.Close()
			return err
		}
		conns[i] = c
		return nil
	})
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if ctx.Err() != nil {
		fmt.Println("interrupted while connecting")
		return 1
	}
	if report("connect", errs) > 0 {
		return 1
	}
	fmt.Printf("ready: %d connections to %s in %s\n", n, addr, time.Since(start).Round(time.Millisecond))

	if hold > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, hold)
		defer cancel()
	}
	<-ctx.Done()
	if !recheck {
		return 0
	}
	// A fresh context: the signal that ended the hold must not cut the
	// recheck short.
	errs = forEach(context.Background(), n, workers, func(i int) error {
		return pingPong(conns[i], dialTimeout)
	})
	if report("recheck", errs) > 0 {
		return 1
	}
	fmt.Printf("recheck: all %d connections answered PING\n", n)
	return 0
}

// forEach runs f(0..n-1) on workers goroutines, stopping early when ctx is
// done, and returns the errors by index (nil for success or not run).
func forEach(ctx context.Context, n, workers int, f func(i int) error) []error {
	errs := make([]error, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				errs[i] = f(i)
			}
		}()
	}
	wg.Wait()
	return errs
}

// pingPong sends PING and expects exactly +PONG within timeout.
func pingPong(c net.Conn, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(ping); err != nil {
		return err
	}
	// Read one line; a throwaway reader is fine because nothing else is
	// pending. A long error line is cut at the buffer size.
	line, err := bufio.NewReaderSize(c, 64).ReadSlice('\n')
	if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
		return err
	}
	if string(line) != string(pong) {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// report prints how many of errs are failures, with the first few distinct
// messages, and returns the count.
func report(what string, errs []error) int {
	failed := 0
	seen := map[string]int{}
	var order []string
	for _, err := range errs {
		if err == nil {
			continue
		}
		failed++
		msg := err.Error()
		if seen[msg] == 0 {
			order = append(order, msg)
		}
		seen[msg]++
	}
	if failed == 0 {
		return 0
	}
	fmt.Printf("%s: %d of %d connections failed\n", what, failed, len(errs))
	for i, msg := range order {
		if i == 5 {
			fmt.Printf("  … and %d other errors\n", len(order)-i)
			break
		}
		fmt.Printf("  %d× %s\n", seen[msg], msg)
	}
	return failed
}
