package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/ackwise/ackwise/adapters"

	// Adapters register their URL schemes when imported.
	_ "github.com/ackwise/ackwise/adapters/gcppubsub"
	_ "github.com/ackwise/ackwise/adapters/kafka"
	_ "github.com/ackwise/ackwise/adapters/memory"
	_ "github.com/ackwise/ackwise/adapters/rabbitmq"
	_ "github.com/ackwise/ackwise/adapters/sqs"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	maxErrorLen = 200 // runes of the error text on an inspect line
	maxSample   = 100000
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runContext(ctx, os.Args[1:], osEnv())
	stop()
	os.Exit(code)
}

// env is what a run talks to: its streams and whether a person is at them.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// stdinTerminal: a person can answer redrive's confirmation.
	stdinTerminal bool
	// stderrTerminal: redrive draws a progress bar, else prints plain
	// progress lines.
	stderrTerminal bool
	// allowMem lets mem:// URLs through. The command refuses them (its
	// in-process broker starts empty in every run); the tests, which run
	// the command inside their own process, share that broker with it.
	allowMem bool
}

func osEnv() env {
	return env{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr,
		stdinTerminal:  term.IsTerminal(int(os.Stdin.Fd())),
		stderrTerminal: term.IsTerminal(int(os.Stderr.Fd())),
	}
}

// usageError is a command line mistake: exit status 2 with a usage message.
type usageError struct {
	msg   string
	usage string
}

func (e *usageError) Error() string { return e.msg }

func usageErr(c *cobra.Command, format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...), usage: c.UsageString()}
}

// runContext runs the command line args (without the program name) and
// returns the exit status: 0 success, 1 runtime error, 2 usage error. A
// cancelled ctx (SIGINT, SIGTERM) ends a run; held dead letters are still
// released.
func runContext(ctx context.Context, args []string, e env) int {
	root := newRoot(e)
	root.SetArgs(legacyFlags(root, args))
	err := root.ExecuteContext(ctx)
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "ackwise: %s\n\n%s", ue.msg, ue.usage)
		return exitUsage
	default:
		fmt.Fprintf(e.stderr, "ackwise: %v\n", err)
		return exitFailed
	}
}

const usageTemplate = `usage: {{.UseLine}}
{{- if .HasAvailableSubCommands}}

commands:{{range .Commands}}{{if .IsAvailableCommand}}
  {{rpad .Name .NamePadding}} {{.Short}}{{end}}{{end}}{{end}}
{{- if .HasAvailableLocalFlags}}

flags:
{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}{{end}}
{{- if .HasAvailableSubCommands}}

Run "{{.CommandPath}} <command> --help" for a command's flags. See docs/redrive.md.{{end}}
`

func newRoot(e env) *cobra.Command {
	root := &cobra.Command{
		Use:   "ackwise <command>",
		Short: "operate ackwise consumers: dead letters and lag",
		Long: `ackwise inspects, counts and redrives the dead letters ackwise consumers wrote,
and measures a consumer's backlog and its time to drain.`,
		Args:          cobra.ArbitraryArgs,
		RunE:          groupRun("no command given"),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetUsageTemplate(usageTemplate)
	root.SetHelpTemplate("{{with .Long}}{{.}}\n\n{{end}}{{.UsageString}}")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return usageErr(c, "%v", err) })
	dlqCmd := &cobra.Command{
		Use:   "dlq <command>",
		Short: "inspect, count and redrive dead letters",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRun("dlq: no command given"),
	}
	dlqCmd.AddCommand(inspectCmd(e), lsCmd(e), showCmd(e), statsCmd(e), redriveCmd(e))
	root.AddCommand(dlqCmd, lagCmd(e), versionCmd(e))
	for _, c := range append([]*cobra.Command{root, dlqCmd}, dlqCmd.Commands()...) {
		c.DisableFlagsInUseLine = true
	}
	return root
}

// groupRun is the RunE of a command that only groups others: called
// without one of them, or with an unknown one, it is a usage error.
func groupRun(none string) func(*cobra.Command, []string) error {
	return func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return usageErr(c, "%s", none)
		}
		return usageErr(c, "unknown command %q", args[0])
	}
}

// positional returns a cobra.Args that wants exactly the arguments names,
// none of them empty, as a usage error otherwise.
func positional(names ...string) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usageErr(c, "want %d argument(s) (%s), got %d", len(names), strings.Join(names, " "), len(args))
		}
		for i, a := range args {
			if a == "" {
				return usageErr(c, "%s is empty", names[i])
			}
		}
		return nil
	}
}

// legacyFlags rewrites the single-dash long flags of the command line
// before cobra (-idle 2s, -json: the flag package's syntax, which this
// command took before it moved to cobra) into the double-dash form, so that
// scripts written for it go on working. Only names the command defines
// are rewritten, and never a flag's value nor anything after "--".
func legacyFlags(root *cobra.Command, args []string) []string {
	c, _, err := root.Find(args)
	if err != nil {
		return args
	}
	c.InitDefaultHelpFlag()
	fs := c.Flags()
	out := make([]string, 0, len(args))
	value := false // args[i] is the value of the flag before it
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if value {
			value = false
			out = append(out, a)
			continue
		}
		if name, ok := strings.CutPrefix(a, "-"); ok && len(name) > 1 {
			double := strings.HasPrefix(name, "-")
			name, _, hasValue := strings.Cut(strings.TrimPrefix(name, "-"), "=")
			if f := fs.Lookup(name); f != nil && (double || len(name) > 1) {
				if !double {
					a = "-" + a
				}
				value = !hasValue && f.NoOptDefVal == ""
			}
		}
		out = append(out, a)
	}
	return out
}

// redact returns rawURL with any password replaced, for messages
// (adapters.RedactURL, unquoted: it also hides a password misplaced by an
// unescaped '/', '?' or '#').
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "<malformed URL>"
	}
	r := adapters.RedactURL(u)
	if s, err := strconv.Unquote(r); err == nil {
		return s
	}
	return r
}

// checkURLs refuses mem:// URLs (see env.allowMem) with the reason.
func checkURLs(c *cobra.Command, e env, urls ...string) error {
	if e.allowMem {
		return nil
	}
	for _, raw := range urls {
		if u, err := url.Parse(raw); err == nil && strings.EqualFold(u.Scheme, "mem") {
			return usageErr(c, "%s: mem:// is the in-process memory broker of this one command run, which starts empty and ends with it: there is nothing in it to inspect or redrive across processes (use it from Go, with dlq.Inspect and dlq.Redrive, in the process that owns the broker)", redact(raw))
		}
	}
	return nil
}

func openSource(ctx context.Context, rawURL string) (adapters.Source, error) {
	src, err := adapters.OpenSource(ctx, rawURL)
	if err != nil {
		// Opener errors never contain the password; they name the URL.
		return nil, fmt.Errorf("open source: %w", err)
	}
	return src, nil
}

// withSource opens rawURL, runs f on the source and closes it.
func withSource(ctx context.Context, rawURL string, f func(src adapters.Source) error) (err error) {
	src, err := openSource(ctx, rawURL)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := src.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close source %s: %w", redact(rawURL), cerr)
		}
	}()
	return f(src)
}
