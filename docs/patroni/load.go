//go:build ignore

// Load is the client side of the failover run in docs/patroni.md, which run.sh
// builds and starts: refunds under fresh idempotency keys from a few workers,
// each key retried until it has a final answer (503, 202, 409 and cut
// connections are retried with the same key, as TestFailover's client does);
// after -before, the primary's postmaster is killed (SIGKILL; with its node's
// Patroni too, to stand for the loss of the whole node) and the time is
// measured to Patroni's promotion of the standby (its REST API's GET /primary
// answering 200) and to the first success of a refund whose key was first sent
// after the kill (a retried older key may be answered from its stored answer
// by a backend that outlives its postmaster for a moment); the
// traffic goes on for -after, then every key is checked: one 201 each, one
// provider refund each, the books balanced, a reconciliation that finds nothing.
//
//	go run docs/patroni/load.go -url http://127.0.0.1:8080 -kill 1234 -promoted http://127.0.0.1:8009/primary
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	base       = flag.String("url", "", "the demo's base URL")
	token      = flag.String("token", "demo-token-a", "the client's bearer token")
	adminToken = flag.String("admin-token", "demo-admin-token", "the operators' token, for the reconciliation")
	workers    = flag.Int("workers", 8, "refunds in flight at once, each on an order of its own")
	before     = flag.Duration("before", 5*time.Second, "traffic before the kill")
	after      = flag.Duration("after", 5*time.Second, "traffic after the first success after the kill")
	kill       = flag.String("kill", "", "the processes killed with SIGKILL after -before, comma-separated pids: the primary's postmaster, and its Patroni to lose the node")
	promoted   = flag.String("promoted", "", "the standby's Patroni URL that answers 200 once it is the primary (GET /primary)")
	patience   = flag.Duration("patience", 3*time.Minute, "how long a key is retried before it counts as lost")
)

// orderAmount is each order's amount: more than its refunds of 1 can reach.
const orderAmount = 1_000_000_000

// result is a key's final answer.
type result struct {
	key              string
	status           int           // 0: no final answer within -patience
	providerRefundID string        // of a 201
	sent             time.Time     // the first request
	took             time.Duration // from the first request to the final answer
}

// final is when r got its final answer.
func (r result) final() time.Time { return r.sent.Add(r.took) }

var client = &http.Client{Timeout: 30 * time.Second}

func main() {
	flag.Parse()
	if *base == "" || *kill == "" || *promoted == "" {
		fmt.Fprintln(os.Stderr, "load: -url, -kill and -promoted are required")
		os.Exit(2)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

func run() error {
	for w := range *workers {
		body := map[string]any{"orderId": orderID(w), "customerId": fmt.Sprintf("cus_%d", w), "amount": orderAmount}
		if st, _, err := post("/orders", "patroni-order-"+orderID(w), body); err != nil || st != http.StatusCreated {
			return fmt.Errorf("create order %s: status %d: %w", orderID(w), st, err)
		}
	}

	var (
		killedAt     atomic.Pointer[time.Time]
		firstSuccess = make(chan time.Time, 1)
		stop         atomic.Bool
		unavailable  atomic.Int64
		mu           sync.Mutex
		results      []result
		wg           sync.WaitGroup
	)
	for w := range *workers {
		wg.Go(func() {
			for n := 0; !stop.Load(); n++ {
				r := result{key: fmt.Sprintf("patroni-refund-%d-%d", w, n)}
				start := time.Now()
				r.sent = start
				deadline := start.Add(*patience)
				for time.Now().Before(deadline) {
					st, body, err := post("/refunds", r.key, map[string]any{"orderId": orderID(w), "amount": 1})
					if st == http.StatusServiceUnavailable {
						unavailable.Add(1)
					}
					if err != nil || st == http.StatusServiceUnavailable || st == http.StatusAccepted || st == http.StatusConflict {
						time.Sleep(100 * time.Millisecond)
						continue
					}
					r.status, r.took = st, time.Since(start)
					var refund struct {
						ProviderRefundID string `json:"providerRefundId"`
					}
					_ = json.Unmarshal(body, &refund)
					r.providerRefundID = refund.ProviderRefundID
					if k := killedAt.Load(); st == http.StatusCreated && k != nil && start.After(*k) {
						select {
						case firstSuccess <- time.Now():
						default:
						}
					}
					break
				}
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}

	time.Sleep(*before)
	now := time.Now()
	killedAt.Store(&now)
	for _, p := range strings.Split(*kill, ",") {
		pid, err := strconv.Atoi(p)
		if err == nil {
			err = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err != nil {
			stop.Store(true)
			wg.Wait()
			return fmt.Errorf("kill %s: %w", p, err)
		}
	}
	fmt.Printf("killed %s at %s\n", *kill, now.UTC().Format("2006-01-02 15:04:05.000"))
	promotedAt := make(chan time.Time, 1)
	go func() {
		for {
			if resp, err := client.Get(*promoted); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					promotedAt <- time.Now()
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()

	var first, promotion time.Time
	select {
	case first = <-firstSuccess:
	case <-time.After(*patience):
	}
	select {
	case promotion = <-promotedAt:
	case <-time.After(*patience):
	}
	time.Sleep(*after)
	stop.Store(true)
	wg.Wait()

	if promotion.IsZero() {
		fmt.Println("kill -> Patroni's promotion: not seen")
	} else {
		fmt.Printf("kill -> Patroni's promotion (standby's GET /primary 200): %.2f s\n", promotion.Sub(now).Seconds())
	}
	if first.IsZero() {
		return fmt.Errorf("no refund succeeded within %s of the kill", *patience)
	}
	fmt.Printf("kill -> first success of a key first sent after the kill: %.2f s\n", first.Sub(now).Seconds())
	fmt.Printf("answers 503 meanwhile (retried with their keys): %d\n", unavailable.Load())
	// In flight at the kill: first sent before it, its final answer after.
	inFlight, slowest := 0, result{}
	for _, r := range results {
		if r.status != 0 && r.sent.Before(now) && r.final().After(now) {
			inFlight++
			if r.final().After(slowest.final()) {
				slowest = r
			}
		}
	}
	if inFlight > 0 && !promotion.IsZero() {
		fmt.Printf("keys in flight at the kill: %d; the last final (%s) %.2f s after Patroni's promotion\n",
			inFlight, slowest.key, slowest.final().Sub(promotion).Seconds())
	}
	return check(results)
}

// check checks every key's answer, the provider's refunds, the books and a
// reconciliation, prints what it found, and returns an error if anything is off.
func check(results []result) error {
	var errs []error
	lost, byProvider, slowest := 0, map[string]string{}, result{}
	for _, r := range results {
		if r.took > slowest.took {
			slowest = r
		}
		switch {
		case r.status != http.StatusCreated:
			lost++
			errs = append(errs, fmt.Errorf("key %s: final status %d, not 201", r.key, r.status))
		case byProvider[r.providerRefundID] != "":
			errs = append(errs, fmt.Errorf("keys %s and %s answered the same provider refund %s", byProvider[r.providerRefundID], r.key, r.providerRefundID))
		default:
			byProvider[r.providerRefundID] = r.key
		}
	}
	fmt.Printf("keys: %d, answered 201: %d, lost: %d\n", len(results), len(results)-lost, lost)
	fmt.Printf("slowest key: %s, final after %.2f s\n", slowest.key, slowest.took.Seconds())

	made, err := providerRefunds()
	if err != nil {
		return err
	}
	missing := 0
	for id := range byProvider {
		if !made[id] {
			missing++
		}
	}
	duplicates := len(made) - len(byProvider) + missing
	fmt.Printf("provider refunds: %d, for %d refunds: duplicates %d, missing %d\n", len(made), len(byProvider), duplicates, missing)
	if duplicates != 0 || missing != 0 {
		errs = append(errs, fmt.Errorf("the provider made %d refunds for %d refunds (%d missing)", len(made), len(byProvider), missing))
	}

	var accounts struct {
		Accounts []struct {
			Account string `json:"account"`
			Balance int64  `json:"balance"`
		} `json:"accounts"`
	}
	if err := getJSON("/accounts", *token, &accounts); err != nil {
		return err
	}
	var sum, merchant int64
	for _, a := range accounts.Accounts {
		sum += a.Balance
		if a.Account == "merchant" {
			merchant = a.Balance
		}
	}
	want := int64(*workers)*orderAmount - int64(len(results)-lost)
	fmt.Printf("books: balances sum to %d, merchant %d (orders less refunds: %d)\n", sum, merchant, want)
	if sum != 0 || merchant != want {
		errs = append(errs, errors.New("the books do not balance"))
	}

	var rep struct {
		Checked    int               `json:"checked"`
		Mismatches []json.RawMessage `json:"mismatches"`
	}
	if err := postJSON("/admin/reconciliation/run", *adminToken, &rep); err != nil {
		return err
	}
	fmt.Printf("reconciliation: %d provider refunds checked, %d mismatches\n", rep.Checked, len(rep.Mismatches))
	for _, m := range rep.Mismatches {
		errs = append(errs, fmt.Errorf("mismatch: %s", m))
	}
	if rep.Checked != len(made) {
		errs = append(errs, fmt.Errorf("the reconciliation checked %d provider refunds, not %d", rep.Checked, len(made)))
	}
	return errors.Join(errs...)
}

func orderID(w int) string { return fmt.Sprintf("P-%d", w) }

// providerRefunds returns the ids of every refund the fake provider made, page
// by page.
func providerRefunds() (map[string]bool, error) {
	ids := map[string]bool{}
	after := ""
	for {
		var page struct {
			Refunds []struct {
				ID string `json:"id"`
			} `json:"refunds"`
			Next *string `json:"next"`
		}
		if err := getJSON("/provider/refunds?limit=1000&after="+url.QueryEscape(after), "", &page); err != nil {
			return nil, err
		}
		for _, r := range page.Refunds {
			ids[r.ID] = true
		}
		if page.Next == nil {
			return ids, nil
		}
		after = *page.Next
	}
}

// post sends a JSON body with a key and the client's token, and returns the
// status and the body of the answer.
func post(path, key string, body any) (int, []byte, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest(http.MethodPost, *base+path, bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+*token)
	req.Header.Set("Idempotency-Key", key)
	return do(req)
}

func getJSON(path, bearer string, v any) error {
	req, err := http.NewRequest(http.MethodGet, *base+path, nil)
	if err != nil {
		return err
	}
	return doJSON(req, bearer, v)
}

func postJSON(path, bearer string, v any) error {
	req, err := http.NewRequest(http.MethodPost, *base+path, nil)
	if err != nil {
		return err
	}
	return doJSON(req, bearer, v)
}

func doJSON(req *http.Request, bearer string, v any) error {
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	st, body, err := do(req)
	if err != nil {
		return err
	}
	if st != http.StatusOK {
		return fmt.Errorf("%s %s: status %d: %s", req.Method, req.URL.Path, st, body)
	}
	return json.Unmarshal(body, v)
}

func do(req *http.Request) (int, []byte, error) {
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}
