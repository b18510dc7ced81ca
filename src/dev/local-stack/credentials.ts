/** Static credentials for the local emulators; they check the signature's shape, not the key. */
export const LOCAL_REGION = "us-east-1";
export const LOCAL_CREDENTIALS = { accessKeyId: "local", secretAccessKey: "local" } as const;
