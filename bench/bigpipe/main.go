// Command bigpipe writes one huge pipeline to a Redis server or proxy
// before reading any reply, as redis-py's execute does, then reads and
// checks every reply: to measure what such a client costs the server.
//
//	bigpipe [-addr 127.0.0.1:6380] [-shape set|get|mset] [-size 600mb] [-value 1kb]
//
// Shapes:
//
//	set   SET bigpipe:<i> <value> until the requests add up to -size: the
//	      server holds the requests (and, Redis, the data)
//	get   SET bigpipe:v <value> once, then GET bigpipe:v until the replies
//	      add up to -size: the server holds the replies
//	mset  one MSET of -value sized values adding up to -size: the server
//	      holds one command of -size
//
// It prints one line: the shape, commands, bytes written and read, and the
// time taken. Exit status 1 if a reply is not the one expected.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6380", "server address host:port")
	shape := flag.String("shape", "set", "set, get or mset")
	size := flag.String("size", "600mb", "requests (set, mset) or replies (get) to send, in bytes (kb, mb, gb: 1024-based)")
	value := flag.String("value", "1kb", "value size")
	timeout := flag.Duration("timeout", 10*time.Minute, "time allowed for the whole pipeline")
	flag.Parse()
	total, err1 := parseSize(*size)
	vsize, err2 := parseSize(*value)
	if err1 != nil || err2 != nil || vsize < 1 || total < vsize {
		fmt.Fprintln(os.Stderr, "bigpipe: -size and -value must be sizes, -size >= -value >= 1")
		os.Exit(2)
	}
	if err := run(*addr, *shape, total, vsize, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "bigpipe:", err)
		os.Exit(1)
	}
}

func parseSize(s string) (int, error) {
	mul := 1
	for suffix, m := range map[string]int{"kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30} {
		if rest, ok := strings.CutSuffix(strings.ToLower(s), suffix); ok {
			s, mul = rest, m
			break
		}
	}
	n, err := strconv.Atoi(s)
	return n * mul, err
}

func bulk(b []byte, s []byte) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, "\r\n"...)
	b = append(b, s...)
	return append(b, "\r\n"...)
}

func run(addr, shape string, total, vsize int, timeout time.Duration) error {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(timeout))
	br := bufio.NewReaderSize(nc, 1<<16)
	bw := bufio.NewWriterSize(nc, 1<<16)
	val := bytes.Repeat([]byte("v"), vsize)
	start := time.Now()

	var n int             // commands written, one reply each
	var want []byte       // the reply expected to each
	var written, read int // bytes
	switch shape {
	case "set":
		want = []byte("+OK\r\n")
		var req []byte
		for written < total {
			req = append(req[:0], "*3\r\n$3\r\nSET\r\n"...)
			req = bulk(req, []byte("bigpipe:"+strconv.Itoa(n)))
			req = bulk(req, val)
			bw.Write(req)
			written += len(req)
			n++
		}
	case "get":
		set := bulk(bulk([]byte("*3\r\n$3\r\nSET\r\n"), []byte("bigpipe:v")), val)
		if _, err := nc.Write(set); err != nil {
			return err
		}
		if line, err := br.ReadString('\n'); err != nil || line != "+OK\r\n" {
			return fmt.Errorf("SET bigpipe:v: %q, %v", line, err)
		}
		want = bulk(nil, val)
		req := []byte("*2\r\n$3\r\nGET\r\n$9\r\nbigpipe:v\r\n")
		for replies := 0; replies < total; replies += len(want) {
			bw.Write(req)
			written += len(req)
			n++
		}
	case "mset":
		want = []byte("+OK\r\n")
		keys := total / vsize
		head := []byte("*" + strconv.Itoa(1+2*keys) + "\r\n$4\r\nMSET\r\n")
		bw.Write(head)
		written += len(head)
		var pair []byte
		for i := range keys {
			pair = bulk(bulk(pair[:0], []byte("bigpipe:"+strconv.Itoa(i))), val)
			bw.Write(pair)
			written += len(pair)
		}
		n = 1
	default:
		return fmt.Errorf("unknown shape %q", shape)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing the pipeline: %w", err)
	}
	wrote := time.Since(start)
	got := make([]byte, len(want))
	for i := range n {
		if _, err := io.ReadFull(br, got); err != nil {
			return fmt.Errorf("reply %d of %d: %w", i+1, n, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("reply %d of %d: %.60q, want %.60q", i+1, n, got, want)
		}
		read += len(got)
	}
	fmt.Printf("%s: %d commands, %d bytes written in %s, %d bytes read, %s in all\n",
		shape, n, written, wrote.Round(time.Millisecond), read, time.Since(start).Round(time.Millisecond))
	return nil
}
