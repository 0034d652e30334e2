package resp

import "bytes"

// SplitArgs splits an inline command line into arguments exactly as Redis's
// sdssplitargs does: blanks separate arguments; "double quotes" take the
// escapes \n \r \t \b \a \xHH and \<any>; 'single quotes' take only \'; a
// closing quote must be followed by a blank or the end of the line. It
// reports false for unbalanced quotes.
func SplitArgs(line []byte) ([][]byte, bool) {
	if z := bytes.IndexByte(line, 0); z >= 0 {
		line = line[:z] // a C string ends at NUL
	}
	var args [][]byte
	i := 0
	at := func(j int) byte { // the C string's view: NUL past the end
		if j < len(line) {
			return line[j]
		}
		return 0
	}
	for {
		for i < len(line) && isSpace(line[i]) {
			i++
		}
		if i >= len(line) {
			return args, true
		}
		var cur []byte
		var quote byte // the open quote, '"' or '\'', or 0
		for done := false; !done; {
			c := at(i)
			switch {
			case quote == '"' && c == '\\' && at(i+1) == 'x' && isHex(at(i+2)) && isHex(at(i+3)):
				cur = append(cur, unhex(at(i+2))<<4|unhex(at(i+3)))
				i += 3
			case quote == '"' && c == '\\' && at(i+1) != 0:
				i++
				cur = append(cur, unescape(line[i]))
			case quote == '\'' && c == '\\' && at(i+1) == '\'':
				i++
				cur = append(cur, '\'')
			case quote != 0 && c == quote:
				if n := at(i + 1); n != 0 && !isSpace(n) {
					return nil, false // a closing quote must end the argument
				}
				done = true
			case quote != 0 && c == 0:
				return nil, false
			case quote != 0:
				cur = append(cur, c)
			case c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == 0:
				done = true
			case c == '"' || c == '\'':
				quote = c
			default:
				cur = append(cur, c)
			}
			if c != 0 {
				i++
			}
		}
		if cur == nil {
			cur = []byte{}
		}
		args = append(args, cur)
	}
}

// isSpace is C's isspace in the C locale.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r'
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= 'a':
		return c - 'a' + 10
	case c >= 'A':
		return c - 'A' + 10
	}
	return c - '0'
}

func unescape(c byte) byte {
	switch c {
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	case 'b':
		return '\b'
	case 'a':
		return '\a'
	}
	return c
}
