package cli

import (
	"io"
	"os"
	"testing"
)

// TestMain runs the tests from the repository's root, where a user runs the
// command: "proxy.yaml" is the shipped file and "go build ." the binary.
func TestMain(m *testing.M) {
	if err := os.Chdir("../.."); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

// run is Main with the shipped proxy.yaml, as the binary has it.
func run(args []string, stdout, stderr io.Writer) int {
	shipped, err := os.ReadFile("proxy.yaml")
	if err != nil {
		panic(err)
	}
	return Main(args, shipped, stdout, stderr)
}
