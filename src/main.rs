fn main() {
    std::process::exit(unstep::cli::main());
}
