; Inno Setup 6 script: a per-user installer for the PyInstaller bundle (dist\hearth, from packaging\hearth.spec).
;
;   iscc /DAppVersion=0.1.0 packaging\windows\hearth.iss      -> dist\Hearth-0.1.0-setup.exe
;
; Installs to %LOCALAPPDATA%\Programs\Hearth without administrator rights (the user may choose an all-users
; install in the dialog), with Start menu and optional desktop shortcuts and an uninstaller in
; Settings > Apps. Users' chats, settings and converted models (in %APPDATA% / %LOCALAPPDATA%\hearth) are kept
; on uninstall.

#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#define AppName "Hearth"
#define RepoRoot "..\.."

[Setup]
AppId={{6C1E3D2A-7B0F-4E55-9A43-5F0D2C8B7E11}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=Hearth developers
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#RepoRoot}\dist
OutputBaseFilename=Hearth-{#AppVersion}-setup
SetupIconFile={#RepoRoot}\resources\icons\hearth.ico
UninstallDisplayIcon={app}\hearth-gui.exe
UninstallDisplayName={#AppName}
Compression=lzma2/max
SolidCompression=yes
LZMANumBlockThreads=4
WizardStyle=modern
; torch's DLLs alone are several hundred MB: keep the installer from splitting into disks.
DiskSpanning=no

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"

[Files]
Source: "{#RepoRoot}\dist\hearth\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{autoprograms}\{#AppName}"; Filename: "{app}\hearth-gui.exe"; IconFilename: "{app}\hearth-gui.exe"; Comment: "Chat with language models on your own computer"
Name: "{autoprograms}\{#AppName} self-test"; Filename: "{cmd}"; Parameters: "/k ""{app}\hearth.exe"" --self-test"; IconFilename: "{app}\hearth-gui.exe"; Comment: "Check this install (offline)"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\hearth-gui.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\hearth-gui.exe"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; Files a run may have created next to the bundle; the user's data lives elsewhere and is kept.
Type: filesandordirs; Name: "{app}"
