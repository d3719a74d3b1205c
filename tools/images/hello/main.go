// Command hello is the test HTTP server of the hello image (make images):
// a pod that runs it answers a GET of any path with the pod's host name and
// the path, and /healthz with ok, so a test can tell which pod a Service
// sent it to. It logs every request to stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	flag.StringVar(&port, "port", port, "port to listen on (default: $PORT, else 8080)")
	get := flag.String("get", "", "instead of serving, GET this URL and print the answer's body (the image has no other client: kubectl exec POD -- /hello -get http://...)")
	flag.Parse()
	if *get != "" {
		if err := fetch(*get); err != nil {
			fmt.Fprintln(os.Stderr, "hello:", err)
			os.Exit(1)
		}
		return
	}
	host, err := os.Hostname()
	if err != nil {
		log.Fatalf("hello: reading the host name: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Addr: ":" + port, Handler: handler(host), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		// The pod is being deleted: finish the requests in flight.
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	fmt.Printf("hello %s listening on :%s\n", host, port)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("hello: %v", err)
	}
}

// fetch prints the body of a GET of url, failing on a status other than
// 200.
func fetch(url string) error {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}

// handler answers "hello from <host>" and the request's path, and ok on
// /healthz, logging each request as "<method> <path> from <remote>".
func handler(host string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "hello from %s\npath %s\n", host, r.URL.Path)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Printf("%s %s from %s\n", r.Method, r.URL.Path, r.RemoteAddr)
		mux.ServeHTTP(w, r)
	})
}
