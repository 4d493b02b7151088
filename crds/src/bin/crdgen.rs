//! Prints a CRD as YAML (`make generate` writes them into crds/): the ResourceWatch CRD,
//! with `cluster` the ClusterResourceWatch CRD, with `policy`
//! the RemediationPolicy CRD.

fn main() -> std::process::ExitCode {
    let yaml = match std::env::args().nth(1).as_deref() {
        None => resourcewatch_crds::crd_yaml(),
        Some("cluster") => resourcewatch_crds::cluster_crd_yaml(),
        Some("policy") => resourcewatch_crds::policy_crd_yaml(),
        Some(other) => {
            eprintln!("crdgen: unknown CRD {other:?} (none, `cluster` or `policy`)");
            return std::process::ExitCode::FAILURE;
        }
    };
    match yaml {
        Ok(yaml) => {
            print!("{yaml}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("crdgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
