package doccheck

import (
	"cmp"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// The programs that serve the documented paths.
const (
	Quickstart = "quickstart" // cmd/quickstart, README.md's quick start
	Demo       = "demo"       // cmd/demo
)

// Paths are the HTTP paths that README.md and the guide tell a reader to open,
// as "METHOD /path" (GET when the text names no method), and the programs that
// serve them; nil for what reads as a path but is none to request. A `{name}`
// stands for an operation's id. TestHTTPPaths fails while the documents name a
// path that is not here, or this names one that they do not; the programs'
// tests request each path here as the program that serves it.
var Paths = map[string][]string{
	"GET /ops":                            {Quickstart, Demo},
	"GET /metrics":                        {Quickstart, Demo},
	"POST /payouts":                       {Quickstart},
	"GET /healthz":                        {Demo},
	"GET /ops/approvals":                  {Demo},
	"GET /admin/approvals":                {Demo},
	"POST /admin/operations/{id}/approve": {Demo},
	"POST /admin/settlements":             {Demo},
	"POST /queue/orders":                  {Demo},
	"POST /provider/webhooks/redeliver":   {Demo},
	"POST /webhooks/provider":             {Demo},
	"GET /operations/{operationId}":       {Quickstart, Demo},
	"GET /provider":                       nil, // the fake provider's mount: its paths are checked
	"GET /usr/lib/postgresql/*/bin":       nil, // a directory
}

// ServedBy returns the paths of Paths that program serves, sorted.
func ServedBy(program string) []string {
	var out []string
	for p, programs := range Paths {
		if slices.Contains(programs, program) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// Request returns the method and the path of p, a key of Paths, with each
// `{name}` in its path replaced by id.
func Request(p, id string) (method, path string) {
	method, path, _ = strings.Cut(p, " ")
	return method, placeholder.ReplaceAllLiteralString(path, id)
}

var placeholder = regexp.MustCompile(`\{[^}]+\}`)

// NotServed reports whether an answer says that nothing serves its request's
// method and path: a 405, or a 404 that is not a JSON error naming what was
// not found (net/http's own "404 page not found", or the code not_found, in
// {"code"} or {"error":{"code"}}, of the demo's, its provider's and opsweb's
// routers). A 404 operation_not_found is served: the
// path was routed, the operation is not there.
func NotServed(status int, body []byte) bool {
	if status == http.StatusMethodNotAllowed {
		return true
	}
	if status != http.StatusNotFound {
		return false
	}
	var e struct {
		Code  string
		Error struct{ Code string }
	}
	if json.Unmarshal(body, &e) != nil {
		return true
	}
	code := cmp.Or(e.Code, e.Error.Code)
	return code == "" || code == "not_found"
}

var (
	// spanPath is a code span that is an HTTP path, perhaps after a method.
	spanPath = regexp.MustCompile(`^(?:(GET|HEAD|POST|PUT|PATCH|DELETE) )?(/[^\s]*)$`)
	// curlURL is a URL on the local host in a shell command.
	curlURL = regexp.MustCompile(`(?:localhost|127\.0\.0\.1):\d+(/[^\s'"]*)`)
)

// HTTPPaths returns the HTTP paths that d names, as the keys of Paths: its
// code spans that are a path (`/ops`, `POST /queue/orders`), and the URLs of
// the local host in its shell code (a curl with -d or --data posts).
func HTTPPaths(d *Doc) []Ref {
	var out []Ref
	for _, s := range d.Spans {
		if m := spanPath.FindStringSubmatch(s.Text); m != nil {
			out = append(out, Ref{Text: cmp.Or(m[1], "GET") + " " + m[2], Line: s.Line})
		}
	}
	for _, b := range d.Blocks {
		if !shell(b.Lang) {
			continue
		}
		for i, line := range strings.Split(b.Text, "\n") {
			line, _, _ = strings.Cut(line, " #")
			for _, m := range curlURL.FindAllStringSubmatch(line, -1) {
				method := "GET"
				if f := strings.Fields(line); slices.Contains(f, "-d") || slices.Contains(f, "--data") || slices.Contains(f, "POST") {
					method = "POST"
				}
				out = append(out, Ref{Text: method + " " + m[1], Line: b.Line + i})
			}
		}
	}
	return out
}

// shell reports whether a code block's language is a shell's (or none).
func shell(lang string) bool {
	switch lang {
	case "", "sh", "bash", "shell", "console":
		return true
	}
	return false
}
