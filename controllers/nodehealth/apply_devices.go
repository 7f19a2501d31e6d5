package nodehealth

import (
	"context"
	"errors"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/gpuhealth/gpuhealth/remediation/devicetaint"
	"github.com/gpuhealth/gpuhealth/remediation/job"
)

// applyDevices makes what the one-GPU workflow asked for before the
// write: each GPU's DeviceTaintRule (made or updated, only gpuhealth's
// own), then the claim template and Job of a GPU's test. A rule of that
// name someone else made is never touched: the pass fails, saying so.
func (r *Reconciler) applyDevices(ctx context.Context, p *plan) error {
	for _, a := range p.deviceActs {
		if a.rule != nil {
			if _, err := devicetaint.Ensure(ctx, r.Client, a.rule); err != nil {
				return fmt.Errorf("quarantining a GPU: %w", err)
			}
		}
		if a.claim != nil {
			if err := r.Client.Create(ctx, a.claim); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating resourceclaimtemplate %s: %w", a.claim.Name, err)
			}
		}
		if a.job != nil {
			if _, err := job.Ensure(ctx, r.Client, a.job); err != nil {
				return err
			}
		}
	}
	return nil
}

// returnDevices deletes, once the status no longer names them, the rules
// and claim templates of the GPUs back in service: a crash in between
// leaves a rule the next pass finds unnamed by any entry, and deletes.
func (r *Reconciler) returnDevices(ctx context.Context, o *observation, p *plan) error {
	var errs []error
	for _, e := range p.returnDevices {
		if err := devicetaint.Remove(ctx, r.Client, e.Rule); err != nil && !errors.Is(err, devicetaint.ErrNotOurs) {
			errs = append(errs, err)
			continue
		}
		err := r.Client.DeleteAllOf(ctx, &resourcev1.ResourceClaimTemplate{}, client.InNamespace(o.namespace),
			client.MatchingLabels{job.NodeLabel: o.node.Name, job.DeviceLabel: e.Device})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting the claim templates of GPU %s: %w", e.Device, err))
		}
	}
	if o.devices != nil {
		// A rule no entry names: left by a crash between a return's write
		// and its deletion, or by a quarantine whose write never came.
		named := map[string]bool{}
		for _, e := range p.status.Devices {
			named[e.Rule] = true
		}
		for _, e := range p.returnDevices {
			named[e.Rule] = true // deleted above
		}
		for name := range o.devices.rules {
			if named[name] || p.fenceOnly || plannedRule(p, name) {
				continue
			}
			log.FromContext(ctx).Info("Deleting a DeviceTaintRule no GPU out of service names", "rule", name)
			if err := devicetaint.Remove(ctx, r.Client, name); err != nil && !errors.Is(err, devicetaint.ErrNotOurs) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// plannedRule says whether the plan made the rule in this pass.
func plannedRule(p *plan, name string) bool {
	for _, a := range p.deviceActs {
		if a.rule != nil && a.rule.Name == name {
			return true
		}
	}
	return false
}
