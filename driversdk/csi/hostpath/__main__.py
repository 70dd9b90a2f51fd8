from driversdk.csi.hostpath.main import main

main()
