//! Prints a CRD as YAML (`make generate` writes them into crds/): the ResourceWatch CRD,
//! or with `cluster` the ClusterResourceWatch CRD.

fn main() -> std::process::ExitCode {
    let yaml = match std::env::args().nth(1).as_deref() {
        None => resourcewatch_crds::crd_yaml(),
        Some("cluster") => resourcewatch_crds::cluster_crd_yaml(),
        Some(other) => {
            eprintln!("crdgen: unknown CRD {other:?} (none, or `cluster`)");
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
