package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestParseByteSize(t *testing.T) {
	tests := []struct {
		in   string
		want ByteSize
	}{
		{"0", 0},
		{"100", 100},
		{"100b", 100},
		{"1k", 1000},
		{"1kb", 1024},
		{"64kb", 64 << 10},
		{"1m", 1000000},
		{"1mb", 1 << 20},
		{"512mb", 512 << 20},
		{"1g", 1000000000},
		{"1gb", 1 << 30},
		{"1GB", 1 << 30},
		{"1Kb", 1024},
		{"8589934591gb", 8589934591 << 30},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseByteSize(tc.in)
			if err != nil || got != tc.want {
				t.Errorf("ParseByteSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
	for _, in := range []string{"", "kb", "-1", "1tb", "1.5gb", "1 kb", "1kib", "0x10", "8589934592gb", "99999999999999999999"} {
		t.Run("bad "+in, func(t *testing.T) {
			if got, err := ParseByteSize(in); err == nil || !strings.HasPrefix(err.Error(), "config: ") {
				t.Errorf("ParseByteSize(%q) = %d, %v; want a config: error", in, got, err)
			}
		})
	}
}

func TestByteSizeYAML(t *testing.T) {
	tests := []struct {
		yml  string
		want ByteSize
		err  string
	}{
		{yml: "1024", want: 1024},
		{yml: "0x400", want: 1024},
		{yml: "1kb", want: 1024},
		{yml: `"2MB"`, want: 2 << 20},
		{yml: "1k", want: 1000},
		{yml: "-5", err: "non-negative"},
		{yml: "1.5", err: "want a size"},
		{yml: "[1]", err: "want a size"},
		{yml: "true", err: "want a size"},
	}
	for _, tc := range tests {
		t.Run(tc.yml, func(t *testing.T) {
			var v struct {
				Size ByteSize `yaml:"size"`
			}
			err := yaml.Unmarshal([]byte("size: "+tc.yml), &v)
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error = %v, want %q", err, tc.err)
			case tc.err == "" && (err != nil || v.Size != tc.want):
				t.Errorf("got %d, %v; want %d", v.Size, err, tc.want)
			}
		})
	}
}

func TestByteSizeString(t *testing.T) {
	tests := []struct {
		in   ByteSize
		want string
	}{
		{0, "0"},
		{1000, "1000"},
		{1024, "1kb"},
		{1536, "1536"},
		{3 << 20, "3mb"},
		{1 << 30, "1gb"},
		{1<<30 + 1<<20, "1025mb"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			if got := tc.in.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
			if back, err := ParseByteSize(tc.in.String()); err != nil || back != tc.in {
				t.Errorf("ParseByteSize(String()) = %d, %v", back, err)
			}
		})
	}
}

func TestDurationYAML(t *testing.T) {
	tests := []struct {
		yml  string
		want time.Duration
		err  bool
	}{
		{yml: "250ms", want: 250 * time.Millisecond},
		{yml: "1s", want: time.Second},
		{yml: "0s", want: 0},
		{yml: "0", want: 0},
		{yml: "1m30s", want: 90 * time.Second},
		{yml: `"2h"`, want: 2 * time.Hour},
		{yml: "-1s", want: -time.Second}, // Validate rejects it, per field
		{yml: "5", err: true},
		{yml: "1.5", err: true},
		{yml: "soon", err: true},
		{yml: `""`, err: true},
		{yml: "1 s", err: true},
		{yml: "[1s]", err: true},
	}
	for _, tc := range tests {
		t.Run(tc.yml, func(t *testing.T) {
			var v struct {
				D Duration `yaml:"d"`
			}
			err := yaml.Unmarshal([]byte("d: "+tc.yml), &v)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), "want a duration") {
					t.Errorf("error = %v, want a duration error", err)
				}
				return
			}
			if err != nil || v.D.Duration() != tc.want {
				t.Errorf("got %v, %v; want %v", v.D, err, tc.want)
			}
		})
	}
}

func TestDurationMarshal(t *testing.T) {
	out, err := yaml.Marshal(map[string]Duration{"d": Duration(1500 * time.Millisecond)})
	if err != nil || string(out) != "d: 1.5s\n" {
		t.Errorf("Marshal = %q, %v", out, err)
	}
}

func TestParseAmount(t *testing.T) {
	tests := []struct {
		in   string
		want Amount
		err  bool
	}{
		{in: "1", want: Amount{Const: 1}},
		{in: "25", want: Amount{Const: 25}},
		{in: "argv:1", want: Amount{ArgvIndex: 1}},
		{in: "ARGV:3", want: Amount{ArgvIndex: 3}},
		{in: "0", err: true},
		{in: "-1", err: true},
		{in: "1.5", err: true},
		{in: "argv:", err: true},
		{in: "argv:0", err: true},
		{in: "argv:-1", err: true},
		{in: "argv:x", err: true},
		{in: "keys:1", err: true},
		{in: "", err: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseAmount(tc.in)
			if tc.err {
				if err == nil || !strings.HasPrefix(err.Error(), "config: ") {
					t.Errorf("ParseAmount(%q) = %+v, %v; want a config: error", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ParseAmount(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			if back, err := ParseAmount(got.String()); err != nil || back != got {
				t.Errorf("ParseAmount(String()) = %+v, %v", back, err)
			}
		})
	}
}

func TestAmountYAML(t *testing.T) {
	tests := []struct {
		yml  string
		want Amount
	}{
		{"1", Amount{Const: 1}},
		{`"1"`, Amount{Const: 1}},
		{"argv:2", Amount{ArgvIndex: 2}},
		{`"argv:1"`, Amount{ArgvIndex: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.yml, func(t *testing.T) {
			var v struct {
				A Amount `yaml:"a"`
			}
			if err := yaml.Unmarshal([]byte("a: "+tc.yml), &v); err != nil || v.A != tc.want {
				t.Errorf("got %+v, %v; want %+v", v.A, err, tc.want)
			}
			out, err := yaml.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			var back struct {
				A Amount `yaml:"a"`
			}
			if err := yaml.Unmarshal(out, &back); err != nil || back.A != tc.want {
				t.Errorf("round trip through %q = %+v, %v", out, back.A, err)
			}
		})
	}
}

func TestSecretNeverPrinted(t *testing.T) {
	const pw = "hunter2"
	s := Secret(pw)
	type holder struct {
		Password Secret `yaml:"password" json:"password"`
	}
	h := holder{Password: s}

	yamlOut, err := yaml.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	jsonOut, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	textOut, err := s.MarshalText()
	if err != nil {
		t.Fatal(err)
	}
	var slogText, slogJSON bytes.Buffer
	slog.New(slog.NewTextHandler(&slogText, nil)).Info("m", "pw", s, "h", h)
	slog.New(slog.NewJSONHandler(&slogJSON, nil)).Info("m", "pw", s, "h", h)

	outputs := map[string]string{
		"%v":         fmt.Sprintf("%v", s),
		"%s":         fmt.Sprintf("%s", s),
		"%q":         fmt.Sprintf("%q", s),
		"%x":         fmt.Sprintf("%x", s),
		"%#v":        fmt.Sprintf("%#v", s),
		"%+v":        fmt.Sprintf("%+v", h),
		"%#v struct": fmt.Sprintf("%#v", h),
		"Sprint":     fmt.Sprint(s, h),
		"yaml":       string(yamlOut),
		"json":       string(jsonOut),
		"text":       string(textOut),
		"slog text":  slogText.String(),
		"slog json":  slogJSON.String(),
	}
	for name, out := range outputs {
		t.Run(name, func(t *testing.T) {
			if strings.Contains(out, pw) || strings.Contains(out, fmt.Sprintf("%x", pw)) {
				t.Errorf("secret printed: %s", out)
			}
		})
	}
	if got := Secret("").String(); got != "" {
		t.Errorf("empty Secret prints %q, want empty", got)
	}
	if s.String() != "******" {
		t.Errorf("String() = %q", s.String())
	}
}
