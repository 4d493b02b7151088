//! Prints the ResourceWatch CRD as YAML (`make generate` writes it into crds/).

fn main() -> std::process::ExitCode {
    match resourcewatch_crds::crd_yaml() {
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
