// Package statuscodes is the one table of UCM's store status codes as UCM-Go returns them, and
// the rendering of that table into the three places that declare them: the Go constants of
// package connector, the enum of the C header ucmgo.h and the constants of the Python package.
// Those places hold generated text between marker lines; `go generate ./connector/` rewrites
// it, and a test fails when any of them disagrees with the table.
package statuscodes

import (
	"bytes"
	"fmt"
	"go/format"
	"strings"
)

// Code is one status code: its name after UCM's (OK, EPARAM, ...), its value and what it means
// here.
type Code struct {
	Name    string
	Value   int32
	Meaning string
}

// Codes are UCM's status codes (ucm/shared/infra/status: OK, ERROR and the codes from -50000
// down, in that order), with what each means in UCM-Go.
var Codes = []Code{
	{"OK", 0, ""},
	{"ERROR", -1, "a failure no other code names"},
	{"EPARAM", -50000, "bad argument: pointer, count, size, shard index, handle"},
	{"EOOM", -50001, "out of memory (staging)"},
	{"EOSERROR", -50002, "the file system failed an operation"},
	{"EDUPLICATE", -50003, "the same block twice in one call, or created twice"},
	{"ERETRY", -50004, "try again (store directory locked by another process)"},
	{"ENOOBJ", -50005, "no such block, or no such task"},
	{"ESERIALIZE", -50006, "not returned by UCM-Go"},
	{"EDESERIALIZE", -50007, "stored bytes failed a check: the block is a miss now"},
	{"EUNSUPPORTED", -50008, "schema mismatch, or an operation this role does not do"},
	{"ENOSPACE", -50009, "no space on the tier or in staging memory"},
	{"ETIMEOUT", -50010, "the task outlived timeout_ms and was cancelled"},
}

// A target is a file holding generated status code text between a begin and an end line.
type target struct {
	begin, end string
	render     func() string
}

// Targets are the files, relative to the connector directory, that declare the status codes.
var targets = map[string]target{
	"status_codes.go": {
		begin: "// BEGIN STATUS CODES (generated from connector/internal/statuscodes; go generate ./connector/)",
		end:   "// END STATUS CODES",
		render: func() string {
			var b strings.Builder
			b.WriteString("\n// UCM's status codes, as the C ABI returns them.\nconst (\n")
			for _, c := range Codes {
				fmt.Fprintf(&b, "\tStatus%s Status = %d", goName(c.Name), c.Value)
				if c.Meaning != "" {
					fmt.Fprintf(&b, " // %s", c.Meaning)
				}
				b.WriteString("\n")
			}
			b.WriteString(")\n\n// statusNames are the codes' names, as UCM spells them.\nvar statusNames = map[Status]string{\n")
			for _, c := range Codes {
				fmt.Fprintf(&b, "\tStatus%s: %q,\n", goName(c.Name), c.Name)
			}
			b.WriteString("}\n")
			return b.String()
		},
	},
	"capi/ucmgo.h": {
		begin: "/* BEGIN STATUS CODES (generated from connector/internal/statuscodes; go generate ./connector/) */",
		end:   "/* END STATUS CODES */",
		render: func() string {
			var b strings.Builder
			b.WriteString("enum {\n")
			for _, c := range Codes {
				fmt.Fprintf(&b, "\tUCMGO_%s = %d,", c.Name, c.Value)
				if c.Meaning != "" {
					fmt.Fprintf(&b, " /* %s */", c.Meaning)
				}
				b.WriteString("\n")
			}
			b.WriteString("};\n")
			return b.String()
		},
	},
	"python/ucmgo/_lib.py": {
		begin: "# BEGIN STATUS CODES (generated from connector/internal/statuscodes; go generate ./connector/)",
		end:   "# END STATUS CODES",
		render: func() string {
			var b strings.Builder
			for _, c := range Codes {
				fmt.Fprintf(&b, "%s = %d", c.Name, c.Value)
				if c.Meaning != "" {
					fmt.Fprintf(&b, "  # %s", c.Meaning)
				}
				b.WriteString("\n")
			}
			b.WriteString("\nSTATUS_NAMES = {\n")
			for _, c := range Codes {
				fmt.Fprintf(&b, "    %s: %q,\n", c.Name, c.Name)
			}
			b.WriteString("}\n")
			return b.String()
		},
	},
}

// goName is a code's Go constant suffix: EPARAM → EParam, EOSERROR → EOSError, OK → OK.
func goName(name string) string {
	special := map[string]string{"OK": "OK", "ERROR": "Error", "EOOM": "EOOM", "EOSERROR": "EOSError",
		"ENOOBJ": "ENoObj", "ENOSPACE": "ENoSpace"}
	if s, ok := special[name]; ok {
		return s
	}
	return "E" + name[1:2] + strings.ToLower(name[2:])
}

// Files returns the paths, relative to the connector directory, of the files that declare the
// status codes.
func Files() []string {
	return []string{"status_codes.go", "capi/ucmgo.h", "python/ucmgo/_lib.py"}
}

// Render returns file's content (named as Files names it) with its generated part replaced by
// the table's current rendering. It fails when the file lacks its marker lines.
func Render(file string, content []byte) ([]byte, error) {
	t, ok := targets[file]
	if !ok {
		return nil, fmt.Errorf("statuscodes: %s is not a status code file", file)
	}
	i := bytes.Index(content, []byte(t.begin+"\n"))
	if i < 0 {
		return nil, fmt.Errorf("statuscodes: %s has no line %q", file, t.begin)
	}
	start := i + len(t.begin) + 1
	j := bytes.Index(content[start:], []byte(t.end+"\n"))
	if j < 0 {
		return nil, fmt.Errorf("statuscodes: %s has no line %q after %q", file, t.end, t.begin)
	}
	var out bytes.Buffer
	out.Write(content[:start])
	out.WriteString(t.render())
	out.Write(content[start+j:])
	if strings.HasSuffix(file, ".go") {
		return format.Source(out.Bytes())
	}
	return out.Bytes(), nil
}
