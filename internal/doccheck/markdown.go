package doccheck

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// Doc is a Markdown file as the checks read it.
type Doc struct {
	// Path is the file's path, as given to Parse.
	Path string
	// Anchors are the fragments that link to the file's headings, as GitHub
	// makes them, and the ids of its HTML anchors.
	Anchors map[string]bool
	// Links are the targets of its links, images and link definitions, outside
	// code.
	Links []Ref
	// Blocks are its fenced code blocks.
	Blocks []Block
	// Spans are its inline code spans, a span broken over lines joined by a
	// space.
	Spans []Ref
}

// Ref is a piece of text and the line it starts on.
type Ref struct {
	Text string
	Line int
}

// Block is a fenced code block: its info string's first word, its text and
// the line of its first line of text.
type Block struct {
	Lang string
	Text string
	Line int
}

// Root returns the repository's root: the closest directory at or above the
// working directory whose go.mod is the library's.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(b, []byte("module github.com/idemflow/idemflow\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("doccheck: no directory above the working directory holds the library's go.mod")
		}
		dir = parent
	}
}

var (
	fence      = regexp.MustCompile("^ {0,3}(```+|~~~+)\\s*([^`\\s]*)")
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	// linkTarget matches the "](target)" of an inline link or image, with an
	// optional title.
	linkTarget = regexp.MustCompile(`\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	linkDef    = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	htmlID     = regexp.MustCompile(`<a\s[^>]*(?:name|id)="([^"]+)"`)
	inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// Parse reads the Markdown file at path.
func Parse(path string) (*Doc, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d := &Doc{Path: path, Anchors: map[string]bool{}}
	lines := strings.Split(string(b), "\n")
	// prose is the file with its code blocks blanked out, line for line.
	prose := make([]string, len(lines))
	var open string // the opening fence of the block we are in
	var block *Block
	seen := map[string]int{}
	for i, line := range lines {
		if open != "" {
			if m := fence.FindStringSubmatch(line); m != nil && m[1][0] == open[0] && len(m[1]) >= len(open) && m[2] == "" {
				d.Blocks = append(d.Blocks, *block)
				open, block = "", nil
				continue
			}
			block.Text += line + "\n"
			continue
		}
		if m := fence.FindStringSubmatch(line); m != nil {
			open, block = m[1], &Block{Lang: m[2], Line: i + 2}
			continue
		}
		prose[i] = line
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			slug := Slug(m[1])
			if n, ok := seen[slug]; ok {
				seen[slug] = n + 1
				slug += "-" + strconv.Itoa(n+1)
			} else {
				seen[slug] = 0
			}
			d.Anchors[slug] = true
		}
	}
	text := strings.Join(prose, "\n")
	text = d.spans(text)
	for _, m := range htmlID.FindAllStringSubmatch(text, -1) {
		d.Anchors[m[1]] = true
	}
	for _, re := range []*regexp.Regexp{linkTarget, linkDef} {
		for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
			d.Links = append(d.Links, Ref{Text: text[m[2]:m[3]], Line: 1 + strings.Count(text[:m[0]], "\n")})
		}
	}
	return d, nil
}

// spans collects the inline code spans of text (CommonMark's: a run of
// backticks up to the next run of as many, within a paragraph) and returns
// text with each blanked out, newlines kept.
func (d *Doc) spans(text string) string {
	out := []byte(text)
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(text) && text[j+m] == '`' {
				m++
			}
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 || strings.Contains(text[i:end], "\n\n") {
			i += n
			continue
		}
		content := strings.ReplaceAll(text[i+n:end], "\n", " ")
		if strings.TrimSpace(content) != "" && strings.HasPrefix(content, " ") && strings.HasSuffix(content, " ") {
			content = content[1 : len(content)-1]
		}
		d.Spans = append(d.Spans, Ref{Text: content, Line: 1 + strings.Count(text[:i], "\n")})
		for k := i; k < end+n; k++ {
			if out[k] != '\n' {
				out[k] = ' '
			}
		}
		i = end + n
	}
	return string(out)
}

// Slug is the anchor GitHub gives a heading's text (before the "-1", "-2"
// that tell equal headings apart): lower case, the text of its links and code,
// punctuation dropped but for hyphens and underscores, spaces as hyphens.
func Slug(heading string) string {
	heading = inlineLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
