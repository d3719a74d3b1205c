package testenv

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// AskHello GETs url with client (http.DefaultClient when nil) and returns
// the name of the pod of the hello image (make images) that answered: its
// answer's first line is "hello from <pod>". A status other than 200, or
// an answer that is not hello's, is an error.
func AskHello(ctx context.Context, client *http.Client, url string) (string, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("GET %s: reading the answer: %w", url, err)
	}
	first, _, _ := strings.Cut(string(body), "\n")
	pod, ok := strings.CutPrefix(strings.TrimSpace(first), "hello from ")
	if resp.StatusCode != http.StatusOK || !ok {
		return "", fmt.Errorf("GET %s: %s %q, not hello's answer", url, resp.Status, first)
	}
	return pod, nil
}
