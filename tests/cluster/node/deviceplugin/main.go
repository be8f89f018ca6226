// deviceplugin advertises accelerators with no hardware behind them to the
// kubelet through the kubelet's device-plugin API (v1beta1), so that a Pod's
// `nvidia.com/gpu: 1` request is admitted and accounted by the real kubelet
// exactly as on a GPU node. Tests only: the devices are names, nothing more.
//
//	deviceplugin -resource nvidia.com/gpu -count 2
//
// Allocate hands each container the IDs it got in TEST_DEVICE_IDS. The plugin
// re-registers when the kubelet restarts (its registration socket is
// recreated) and exits on SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	done    chan struct{}
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-s.Context().Done():
	case <-p.done:
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"TEST_DEVICE_IDS": strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func inode(path string) uint64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// serve runs one registration: it returns when the kubelet's socket changes
// (a restarted kubelet), its own socket disappears, or a signal arrives.
func serve(dir, resource string, count int, sigs <-chan os.Signal) (stop bool, err error) {
	sockName := strings.NewReplacer("/", "-", ".", "-").Replace(resource) + "-sdcguard-test.sock"
	sock := filepath.Join(dir, sockName)
	_ = os.Remove(sock)
	lis, err := net.Listen("unix", sock)
	if err != nil {
		return false, fmt.Errorf("listen on %s: %w", sock, err)
	}
	p := &plugin{done: make(chan struct{})}
	for i := 0; i < count; i++ {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("test-dev-%d", i), Health: pluginapi.Healthy})
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	defer func() { close(p.done); srv.Stop(); _ = os.Remove(sock) }()

	kubeletSock := filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false, fmt.Errorf("dial %s: %w", kubeletSock, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     sockName,
		ResourceName: resource,
	})
	if err != nil {
		return false, fmt.Errorf("register %s with the kubelet at %s: %w", resource, kubeletSock, err)
	}
	log.Printf("registered %d x %s", count, resource)
	kubeletIno := inode(kubeletSock)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-sigs:
			return true, nil
		case <-tick.C:
			if inode(kubeletSock) != kubeletIno || inode(sock) == 0 {
				log.Printf("kubelet restarted; registering again")
				return false, nil
			}
		}
	}
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugin directory")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name to advertise")
	count := flag.Int("count", 2, "number of devices")
	flag.Parse()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	for {
		// Wait for the kubelet's registration socket.
		for inode(filepath.Join(*dir, filepath.Base(pluginapi.KubeletSocket))) == 0 {
			select {
			case <-sigs:
				return
			case <-time.After(500 * time.Millisecond):
			}
		}
		stop, err := serve(*dir, *resource, *count, sigs)
		if err != nil {
			log.Printf("%v; retrying in 1s", err)
			time.Sleep(time.Second)
			continue
		}
		if stop {
			return
		}
	}
}
