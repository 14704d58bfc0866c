// Package redact takes internal addresses out of texts that operators are
// answered with: an outside service's URL, a database URL, a host and port
// that a Go error (a *url.Error, a dial error, an httpstep error) names. The
// text is still the engine's for the rest; the address is in the process's
// log, which keeps every error whole.
package redact

import "regexp"

// Withheld replaces what Addresses takes out.
const Withheld = "[address withheld]"

var (
	// url is a URL of any scheme (http, https, postgres...), up to white
	// space or a quote, as Go's errors print it (`Get "http://...": ...`),
	// without the punctuation of the sentence around it.
	url = regexp.MustCompile(`(?i)\b[a-z][a-z0-9+.-]*://[^\s"'<>]*[^\s"'<>:;,.)]`)
	// dial is the address of a dial error: "dial tcp 10.0.0.7:443: ...",
	// "dial tcp: lookup provider.internal ...".
	dial = regexp.MustCompile(`\b(dial (?:tcp|udp)[46]?(?::)? )(?:lookup )?[^\s:\[][^\s:]*(?::\d+)?`)
	// ipv4 and ipv6 are addresses, with a port or without; an IPv6 zone
	// follows %.
	ipv4 = regexp.MustCompile(`\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b`)
	ipv6 = regexp.MustCompile(`\[[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:%[0-9A-Za-z]+)?\](?::\d+)?`)
	// hostPort is a dotted host name with a port ("psp.internal:443"), as
	// a read or write error on a connection names its ends; lookup is the
	// host a name lookup failed for.
	hostPort = regexp.MustCompile(`\b[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+:\d{1,5}\b`)
	lookup   = regexp.MustCompile(`\b(lookup )[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+`)
)

// Addresses returns s with every URL and network address in it replaced by
// Withheld.
func Addresses(s string) string {
	s = url.ReplaceAllString(s, Withheld)
	s = ipv6.ReplaceAllString(s, Withheld)
	s = ipv4.ReplaceAllString(s, Withheld)
	s = hostPort.ReplaceAllString(s, Withheld)
	s = dial.ReplaceAllString(s, "${1}"+Withheld)
	return lookup.ReplaceAllString(s, "${1}"+Withheld)
}
