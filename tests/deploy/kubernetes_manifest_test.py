#!/usr/bin/env python3
"""The Kubernetes manifest (deploy/kubernetes/chorus-job.yaml) checked offline: no cluster.

Three readers, each used when present:
- kubectl, client side only (`kubectl label --local --dry-run=client -f FILE -o json`, with
  KUBECONFIG=/dev/null: it decodes every document as kubectl apply would, and contacts no server;
  `kubectl create/apply --dry-run=client` cannot, they need a server's API discovery);
- PyYAML, which must read the same objects as kubectl (YAML 1.1 octal modes such as 0400 included);
- kubernetes-validate (PyPI; scripts/setup installs it): each object against the OpenAPI schemas
  of every bundled Kubernetes version from 1.27 on, strict (an unknown or misspelled field fails).

Then what chorus needs from the objects: an Indexed Job (completionMode Indexed, completions =
parallelism = --nnodes), the node rank from JOB_COMPLETION_INDEX, the rendezvous at pod 0's stable
name <job>-0.<service>:PORT through a headless Service (clusterIP None, the pods' subdomain, its
selector matching the pods, the port among its ports), the job secret as a file from a Kubernetes
Secret volume of mode 0400 or 0600 (never in the environment, no fsGroup, no Secret object with a
value in the file), the job file from the ConfigMap (valid TOML with devices), cpu and memory
requests and limits, the commented nvidia.com/gpu form, a memory-backed /dev/shm. The checker
itself is checked: a copy without completionMode must fail it, and the schemas must reject a
misspelled field.

Exit 0 pass, 1 fail, 77 skip (neither kubectl nor PyYAML present), with the reason.

Usage: kubernetes_manifest_test.py [--manifest FILE] [--kubectl PATH]
"""
import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tomllib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from script_support import Failure, Skip, exit_code  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
MANIFEST = os.path.join(REPO, "deploy", "kubernetes", "chorus-job.yaml")
OLDEST_VERSION = (1, 27)
CHECK_LABEL = "chorus.test/checked"


def expect(condition, message):
    if not condition:
        raise Failure(message)


def read_with_kubectl(kubectl, manifest):
    environment = dict(os.environ, KUBECONFIG="/dev/null")
    result = subprocess.run(
        [kubectl, "label", "--local", "--dry-run=client", "-f", manifest, f"{CHECK_LABEL}=yes",
         "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=environment, timeout=60)
    if result.returncode != 0:
        raise Failure(f"kubectl could not read {manifest}:\n{result.stderr}")
    decoder, text, objects, at = json.JSONDecoder(), result.stdout, [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        item, at = decoder.raw_decode(text, at)
        objects.extend(item["items"] if item.get("kind") == "List" else [item])
    for item in objects:  # the label this reading added
        labels = item["metadata"]["labels"]
        del labels[CHECK_LABEL]
        if not labels:
            del item["metadata"]["labels"]
    return objects


def read_with_pyyaml(manifest):
    import yaml
    with open(manifest) as f:
        return [document for document in yaml.safe_load_all(f) if document]


def validate_schemas(objects):
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions
    versions = sorted(
        {v for v in all_versions()
         if tuple(int(x) for x in v.split(".")[:2]) >= OLDEST_VERSION},
        key=lambda v: tuple(int(x) for x in v.split(".")))
    expect(versions, f"kubernetes-validate has no schemas from {OLDEST_VERSION} on")
    for version in versions:
        for item in objects:
            try:
                kubernetes_validate.validate(item, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                raise Failure(f"{item['kind']}/{item['metadata']['name']} is invalid for "
                              f"Kubernetes {version}: {error.message} at {list(error.path)}")
    # The validator must see a misspelled field (strict), or passing means nothing.
    job = copy.deepcopy(next(o for o in objects if o["kind"] == "Job"))
    job["spec"]["completionMod"] = job["spec"].pop("completionMode")
    try:
        kubernetes_validate.validate(job, versions[-1], strict=True)
    except kubernetes_validate.ValidationError:
        pass
    else:
        raise Failure("kubernetes-validate accepted a Job with a misspelled completionMode")
    return f"{versions[0]}..{versions[-1]}"


def option(args, name):
    expect(name in args, f"the container's args lack {name}")
    expect(args.index(name) + 1 < len(args), f"{name} has no value")
    return args[args.index(name) + 1]


def check_objects(objects, raw_text):
    kinds = [o["kind"] for o in objects]
    expect("Secret" not in kinds, "the manifest holds a Secret: a job secret must not be in a "
           "file under version control (create it with kubectl create secret)")
    jobs = [o for o in objects if o["kind"] == "Job"]
    expect(len(jobs) == 1, f"want one Job, found kinds {kinds}")
    job = jobs[0]
    spec = job["spec"]
    expect(job["apiVersion"] == "batch/v1", f"Job apiVersion {job['apiVersion']}")
    expect(spec.get("completionMode") == "Indexed", "the Job is not Indexed (completionMode)")
    pod = spec["template"]["spec"]
    expect(pod.get("restartPolicy") == "Never", "restartPolicy must be Never")
    containers = pod["containers"]
    expect(len(containers) == 1, "want one container per pod")
    container = containers[0]
    args = [str(a) for a in container.get("command", []) + container.get("args", [])]
    expect("train" in args, "the container does not run `chorus train`")

    nnodes = int(option(args, "--nnodes"))
    expect(spec.get("completions") == nnodes and spec.get("parallelism") == nnodes,
           f"completions {spec.get('completions')} and parallelism {spec.get('parallelism')} "
           f"must both equal --nnodes {nnodes}")
    expect(option(args, "--node-rank") == "$(JOB_COMPLETION_INDEX)",
           "--node-rank must be $(JOB_COMPLETION_INDEX)")
    env = {e["name"]: e for e in container.get("env", [])}
    if "JOB_COMPLETION_INDEX" in env:
        field = env["JOB_COMPLETION_INDEX"].get("valueFrom", {}).get("fieldRef", {})
        expect(field.get("fieldPath") ==
               "metadata.annotations['batch.kubernetes.io/job-completion-index']",
               "JOB_COMPLETION_INDEX must come from the completion index annotation")

    # The rendezvous: pod 0's stable name through the headless Service.
    services = [o for o in objects if o["kind"] == "Service"]
    expect(len(services) == 1, "want one Service")
    service = services[0]
    service_name = service["metadata"]["name"]
    expect(service["spec"].get("clusterIP") == "None", "the Service is not headless (clusterIP)")
    expect(service["spec"].get("publishNotReadyAddresses") is True,
           "publishNotReadyAddresses must be true (pod 0's name before any readiness)")
    expect(pod.get("subdomain") == service_name,
           f"the pods' subdomain {pod.get('subdomain')} is not the Service {service_name}")
    labels = spec["template"]["metadata"].get("labels", {})
    selector = service["spec"].get("selector", {})
    expect(selector and all(labels.get(k) == v for k, v in selector.items()),
           f"the Service's selector {selector} does not match the pods' labels {labels}")
    host, _, port = option(args, "--rdzv-endpoint").rpartition(":")
    job_name = job["metadata"]["name"]
    expect(host in (f"{job_name}-0.{service_name}", f"{job_name}-0.{service_name}.svc")
           or host.startswith(f"{job_name}-0.{service_name}."),
           f"--rdzv-endpoint host {host} is not pod 0's name {job_name}-0.{service_name}")
    expect(int(port) in [p["port"] for p in service["spec"]["ports"]],
           f"the rendezvous port {port} is not a port of the Service")

    # The secret: a file from a Secret volume, owner-only, never in the environment.
    mounts = {m["mountPath"].rstrip("/"): m for m in container.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    secret_file = option(args, "--secret-file")
    directory, _, key = secret_file.rpartition("/")
    expect(directory in mounts, f"--secret-file {secret_file} is not in a mounted volume")
    volume = volumes[mounts[directory]["name"]]
    expect("secret" in volume, f"--secret-file {secret_file} is not on a Secret volume")
    mode = volume["secret"].get("defaultMode")
    items = {i["path"]: i for i in volume["secret"].get("items", [])}
    if key in items and "mode" in items[key]:
        mode = items[key]["mode"]
    expect(mode in (0o400, 0o600), "the secret file's mode is " + (oct(mode) if isinstance(mode, int) else repr(mode)) + ", not 0400 or 0600")
    expect(mounts[directory].get("readOnly") is True, "mount the secret read-only")
    for entry in container.get("env", []):
        expect("secretKeyRef" not in entry.get("valueFrom", {}),
               f"{entry['name']} comes from a Secret: chorus takes the job secret as a file only")
        expect(entry["name"] != "CHORUS_JOB_SECRET", "CHORUS_JOB_SECRET is refused by chorus")
    expect(not any("secretRef" in e for e in container.get("envFrom", [])),
           "envFrom a Secret: chorus takes the job secret as a file only")
    expect("fsGroup" not in pod.get("securityContext", {}),
           "fsGroup would make the secret file group-readable, which chorus refuses")

    # The job file: a key of a ConfigMap volume, valid TOML with devices.
    config = next((a for a in args if a.endswith(".toml")), None)
    expect(config is not None, "the container names no job file (.toml)")
    directory, _, key = config.rpartition("/")
    expect(directory in mounts and "configMap" in volumes[mounts[directory]["name"]],
           f"the job file {config} is not on a ConfigMap volume")
    config_map_name = volumes[mounts[directory]["name"]]["configMap"]["name"]
    config_maps = [o for o in objects
                   if o["kind"] == "ConfigMap" and o["metadata"]["name"] == config_map_name]
    expect(config_maps and key in config_maps[0].get("data", {}),
           f"no ConfigMap {config_map_name} with key {key} in the manifest")
    job_toml = tomllib.loads(config_maps[0]["data"][key])
    expect("devices" in job_toml, "the job file sets no devices")

    # Resources, the GPU form, /dev/shm.
    resources = container.get("resources", {})
    for kind in ("requests", "limits"):
        for resource in ("cpu", "memory"):
            expect(resource in resources.get(kind, {}), f"resources.{kind}.{resource} is missing")
    expect(any(line.strip().startswith("# nvidia.com/gpu:") for line in raw_text.splitlines()),
           "the commented nvidia.com/gpu form is missing")
    expect("/dev/shm" in mounts and
           volumes[mounts["/dev/shm"]["name"]].get("emptyDir", {}).get("medium") == "Memory",
           "/dev/shm must be a memory-backed emptyDir (the default is 64 MiB)")
    return nnodes, f"{job_name}-0.{service_name}:{port}"


def manifest_checks(args):
    with open(args.manifest) as f:
        raw_text = f.read()
    readers = {}
    if args.kubectl:
        readers["kubectl"] = read_with_kubectl(args.kubectl, args.manifest)
        print(f"kubectl ({args.kubectl}, client side, no server) read "
              f"{[o['kind'] for o in readers['kubectl']]}")
    else:
        print("kubectl: not installed, not used")
    try:
        readers["PyYAML"] = read_with_pyyaml(args.manifest)
        print(f"PyYAML read {[o['kind'] for o in readers['PyYAML']]}")
    except ImportError:
        print("PyYAML: not installed, not used")
    if not readers:
        raise Skip("neither kubectl nor PyYAML is installed: nothing can read the manifest")
    if len(readers) == 2:
        expect(readers["kubectl"] == readers["PyYAML"],
               "kubectl and PyYAML read different objects from the manifest")
    objects = next(iter(readers.values()))
    try:
        versions = validate_schemas(objects)
        print(f"kubernetes-validate: every object valid (strict) for Kubernetes {versions}")
    except ImportError:
        print("kubernetes-validate: not installed, the schemas were NOT checked "
              "(scripts/setup installs it)")
    nnodes, endpoint = check_objects(objects, raw_text)
    broken = copy.deepcopy(objects)
    del next(o for o in broken if o["kind"] == "Job")["spec"]["completionMode"]
    try:
        check_objects(broken, raw_text)
    except Failure:
        pass
    else:
        raise Failure("the checks accepted a Job without completionMode")
    print(f"an Indexed Job of {nnodes} nodes, rendezvous at {endpoint}, the secret as a file")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", default=MANIFEST)
    parser.add_argument("--kubectl", default=shutil.which("kubectl"))
    args = parser.parse_args()
    return exit_code(lambda: manifest_checks(args))


if __name__ == "__main__":
    sys.exit(main())
