// Command plrl-k8s is the local Kubernetes control plane used by plrl's tests and `make cluster-up`:
// one binary, so the packages the components share compile once, with a subcommand per component.
// Each component still runs as its own process (started by tests/infra/controlplane.py), which keeps
// their global flags, metrics registries and signal handling apart.
//
//	plrl-k8s etcd --data-dir D --listen-client-url URL --listen-peer-url URL
//	plrl-k8s kube-apiserver|kube-controller-manager|kube-scheduler [the component's own flags]
//	plrl-k8s certs --dir D [--hosts 127.0.0.1,localhost]
//	plrl-k8s version
package main

import (
	"fmt"
	"os"
	"runtime/debug"
	_ "time/tzdata" // CronJob time zones, as the upstream mains do

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = `usage: plrl-k8s COMPONENT [flags]
components: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, certs, version`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	switch name {
	case "etcd":
		os.Exit(runEtcd(args))
	case "certs":
		os.Exit(runCerts(args))
	case "kube-apiserver":
		os.Exit(runComponent(apiserver.NewAPIServerCommand(), name, args))
	case "kube-controller-manager":
		os.Exit(runComponent(controllermanager.NewControllerManagerCommand(), name, args))
	case "kube-scheduler":
		os.Exit(runComponent(scheduler.NewSchedulerCommand(), name, args))
	case "version":
		fmt.Println(kubernetesVersion())
	default:
		fmt.Fprintf(os.Stderr, "plrl-k8s: unknown component %q\n%s\n", name, usage)
		os.Exit(2)
	}
}

// runComponent runs an upstream component's cobra command exactly as its own main would, with the
// arguments after the subcommand name.
func runComponent(cmd *cobra.Command, name string, args []string) int {
	cmd.Use = name
	cmd.SetArgs(args)
	return cli.Run(cmd)
}

// kubernetesVersion is the pinned k8s.io/kubernetes module version, read from the build info so the
// binary cannot disagree with go.mod.
func kubernetesVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "k8s.io/kubernetes" {
				return dep.Version
			}
		}
	}
	return "unknown"
}
